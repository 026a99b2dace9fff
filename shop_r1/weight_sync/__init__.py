"""Weight sync from the learner to the rollout engines: both ends of each wire live in one module."""
