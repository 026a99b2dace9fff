"""The Ray edge: the only package that touches `ray.remote`, actors and placement groups.

Plain classes (engines, learners, reward workers) become actors here. Every group also has a local mode
(`ray.local_mode=true`) in which the same typed methods run in this process, so one driver serves unit tests and
clusters alike.
"""
