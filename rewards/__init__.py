"""Reward functions for Claw-R1: load them by name, call them one way, run them as a stream worker.

The same ``module:function`` reward function serves the compat port's ``/compute_reward`` route and the
``clawr1 rewarder`` role, so a user writes it once.
"""

from clawr1.rewards.loader import RewardFn, RewardFnError, RewardResult, compute_reward, load_reward_fn

__all__ = ["RewardFn", "RewardFnError", "RewardResult", "compute_reward", "load_reward_fn"]
