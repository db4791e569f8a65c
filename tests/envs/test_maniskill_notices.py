"""ManiSkill's per-env "No initial pose set for actor builder of goal_region" notice is dropped
(PullCube logs it for a kinematic visual marker); the same notice for any other actor
still reaches the user."""

import logging


def test_goal_marker_notice_is_dropped_and_other_actors_notices_pass(capfd):
    import gymnasium as gym

    from rlinf_embodied.envs.maniskill import _registered

    _registered("PullCube-v1")  # installs the filter, then registers the tasks
    env = gym.make("PullCube-v1", obs_mode="state", num_envs=1)
    env.reset(seed=0)
    env.close()
    logger = logging.getLogger("mani_skill ")  # mani_skill's own name (trailing space)
    logger.warning("No initial pose set for actor builder of my_peg, setting to default pose")
    err = capfd.readouterr().err
    assert "actor builder of goal_region" not in err, err
    assert "No initial pose set for actor builder of my_peg" in err, err
