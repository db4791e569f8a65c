"""ManiSkill's per-env "No initial pose set for actor builder of goal_region" notice is dropped
(PullCube logs it for a kinematic visual marker); the same notice for any other actor still
reaches the user."""

import logging


class _Records(logging.Handler):
    """Collects what passes the logger's filters (mani_skill's own handler writes to a stream
    that an earlier test may have captured, so stderr is no place to look)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_goal_marker_notice_is_dropped_and_other_actors_notices_pass():
    import gymnasium as gym

    from rlinf_embodied.envs.maniskill import _registered

    _registered("PullCube-v1")  # installs the filter, then registers the tasks
    logger = logging.getLogger("mani_skill ")  # mani_skill's own name (trailing space)
    seen = _Records()
    logger.addHandler(seen)
    try:
        env = gym.make("PullCube-v1", obs_mode="state", num_envs=1)
        env.reset(seed=0)
        env.close()
        logger.warning("No initial pose set for actor builder of my_peg, setting to default pose")
    finally:
        logger.removeHandler(seen)
    assert not any("actor builder of goal_region" in m for m in seen.messages), seen.messages
    assert any("actor builder of my_peg" in m for m in seen.messages), seen.messages
