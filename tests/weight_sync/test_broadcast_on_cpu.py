"""The weight-sync wire on gloo, both ends in one process (sender in a thread), with the store opened on port 0."""

from __future__ import annotations

import threading

import torch

from shop_r1.weight_sync.broadcast import SyncGroupSpec, WeightReceiver, WeightSender, make_manifest, open_master_store


def test_bucketed_broadcast_over_a_store_on_an_os_picked_port():
    tensors = [(f"w{i}", torch.randn(37, 11) * (i + 1)) for i in range(5)] + [("bias", torch.randn(7))]
    named = [(n, tuple(t.shape), torch.float32) for n, t in tensors[:3]] + \
            [(n, tuple(t.shape), torch.bfloat16) for n, t in tensors[3:]]
    manifest = make_manifest(named, bucket_bytes=2 * 37 * 11 * 4)
    assert [len(b) for b in manifest.buckets] == [2, 1, 3]  # split by size, then by dtype

    store = open_master_store("127.0.0.1", timeout_s=60)
    assert store.port > 0
    spec = SyncGroupSpec("127.0.0.1", store.port, world_size=2, timeout_s=60)
    result: dict = {}

    def send() -> None:
        sender = WeightSender(spec, torch.device("cpu"), store=store)
        result["sent"] = sender.send(manifest, iter(tensors))

    thread = threading.Thread(target=send)
    thread.start()
    receiver = WeightReceiver(spec, 1, torch.device("cpu"))
    got = [(n, t.clone()) for n, t in receiver.receive(manifest)]
    thread.join(timeout=60)

    assert result["sent"] == manifest.num_bytes
    assert [n for n, _ in got] == [n for n, _ in tensors]
    for (_, want), (_, have), (_, _, dtype) in zip(tensors, got, named):
        assert have.dtype == dtype
        torch.testing.assert_close(have, want.to(dtype))
