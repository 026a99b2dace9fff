"""The pure layer must not pull in the distributed stack: it runs in reward actors, CI and notebooks alike."""

import subprocess
import sys

HEAVY = ("ray", "vllm", "deepspeed")


def test_pure_modules_import_none_of_ray_vllm_deepspeed():
    code = (
        "import sys\n"
        "import shop_r1.config, shop_r1.types, shop_r1.data, shop_r1.reward, shop_r1.metrics\n"
        "import shop_r1.data.sessions, shop_r1.data.synth, shop_r1.data.examples, shop_r1.data.prompts\n"
        "import shop_r1.reward.scorer, shop_r1.reward.io\n"
        "import shop_r1.bootstrap, shop_r1.baselines, shop_r1.comparison, shop_r1.report\n"
        f"loaded = sorted(m for m in {HEAVY!r} if m in sys.modules)\n"
        "print(','.join(loaded))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"pure modules imported {out.stdout.strip()}"


def test_the_reward_data_config_and_metrics_layers_import_no_torch():
    """Reward actors, `shop-r1 reward score` and `shop-r1 eval metrics` import only these: no torch (1.4 s and
    ~300 MB per reward worker before)."""
    code = ("import sys\n"
            "import shop_r1.reward, shop_r1.reward.scorer, shop_r1.reward.worker, shop_r1.reward.io\n"
            "import shop_r1.data, shop_r1.data.build, shop_r1.data.examples, shop_r1.config, shop_r1.metrics\n"
            "import shop_r1.bootstrap, shop_r1.baselines, shop_r1.comparison\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_check_itself_sees_a_heavy_import():
    # Guards the test above against passing vacuously (e.g. a wrong module name in the check).
    code = "import sys, ray; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_python_api_names_resolve_lazily():
    """`from shop_r1 import ...` gives the documented API; `import shop_r1` alone loads none of the heavy stack."""
    code = ("import sys, shop_r1\n"
            "light = not any(m in sys.modules for m in ('torch', 'ray', 'vllm', 'deepspeed', 'shop_r1.train'))\n"
            "from shop_r1 import load_config, run_pipeline, run_grpo, run_sft, run_eval, score_response, make_report\n"
            "cfg = load_config(None, ['rl.steps=3'])\n"
            "print(light, cfg.rl.steps, run_grpo.__module__, run_eval.__module__, sorted(shop_r1.__all__)[0])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "3", "shop_r1.train", "shop_r1.evaluate", "Config"]
