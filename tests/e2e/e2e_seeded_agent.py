"""verl's single-turn agent loop with a per-trajectory sampling seed (e2e resume test only).

Why: the resume test compares the controller state after step 3 of a run resumed from the step-2
checkpoint with the uninterrupted run's. Step 3's rollouts feed that state, so they must be the
same in both processes. Without a per-request seed, vLLM samples from its engine-wide generator,
whose position depends on everything the server generated before (steps 1-2 in one run, nothing in
the other). verl 0.9.1's ``rollout.full_determinism`` gives every request the SAME seed, which
makes all rollouts of a prompt identical (every group all-correct or all-wrong, zero GRPO
advantage). This loop instead seeds each trajectory from its stable prompt id (``index``, from
``extra_info.index``) and its session number within the group, so rollouts of a prompt differ
from each other but are reproducible across processes given the same weights.

Registered under ``e2e_seeded_agent`` (verl's agent-loop registry) on import; selected with
``actor_rollout_ref.rollout.agent.default_agent_loop=e2e_seeded_agent``. It only adds ``seed`` to
the sampling parameters and then runs verl's own ``SingleTurnAgentLoop.run``.
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

AGENT_NAME = "e2e_seeded_agent"


def trajectory_seed(index: Any, session_id: Any, base: int = 1234) -> int:
    """A distinct, reproducible 31-bit seed per (stable prompt id, session within the group)."""
    return (base + 7919 * int(index) + 104729 * int(session_id)) % (2**31 - 1)


@register(AGENT_NAME)
class SeededSingleTurnAgentLoop(SingleTurnAgentLoop):
    """``SingleTurnAgentLoop`` whose vLLM request carries ``seed = trajectory_seed(index, session)``."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        params = dict(sampling_params)
        if "index" in kwargs and "session_id" in kwargs:
            params.setdefault("seed", trajectory_seed(kwargs["index"], kwargs["session_id"]))
        return await super().run(params, **kwargs)
