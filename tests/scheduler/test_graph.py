"""Workflow graph: cycle collapse, topological stages, validation."""

import pytest

from rlinf_embodied.scheduler.graph import Edge, Node, WorkflowGraph, chain_graph, embodied_graph


def test_embodied_cycle_collapses_and_weights_edge_is_ignored():
    g = embodied_graph(num_envs=16, rollout_steps=10, update_epochs=2, obs_bytes=100,
                       action_bytes=8, sample_bytes=108)
    stages = g.stages()
    assert [s.members for s in stages] == [("env", "rollout"), ("actor",)]
    cycle, actor = stages
    assert cycle.is_cycle and cycle.items == 16 and cycle.rounds == 10
    assert cycle.ring_bytes == (100, 8)  # env->rollout obs, rollout->env actions
    # one optimizer step per round: 2 epochs over one minibatch of all 160 samples
    assert (actor.items, actor.rounds) == (16 * 10, 2) and actor.in_bytes == 108 * 16 * 10


def test_actor_rounds_are_optimizer_steps_so_micro_batches_never_exceed_a_minibatch():
    g = embodied_graph(num_envs=16, rollout_steps=50, update_epochs=4, num_minibatches=4,
                       sample_bytes=100)
    actor = g.stages()[1]
    assert (actor.items, actor.rounds) == (200, 16)  # 800 samples / 4 minibatches, 4 x 4 steps
    assert actor.in_bytes == 100 * 16 * 50  # the trajectory still carries all N x T samples


def test_chain_is_topological_and_cuts_are_valid():
    g = WorkflowGraph(
        nodes=(Node("c", 4), Node("a", 4), Node("b", 4)),
        edges=(Edge("a", "b"), Edge("b", "c")),
    )
    assert [s.label for s in g.stages()] == ["a", "b", "c"]
    assert [s.label for s in chain_graph({"x": 1, "y": 2}).stages()] == ["x", "y"]


def test_cycle_with_mismatched_work_is_rejected():
    with pytest.raises(ValueError, match="same items and rounds"):
        WorkflowGraph(nodes=(Node("a", 4, 2), Node("b", 8, 2)), edges=(Edge("a", "b"), Edge("b", "a")))


def test_unknown_edge_end_names_the_nodes():
    with pytest.raises(ValueError, match="unknown node 'z'"):
        WorkflowGraph(nodes=(Node("a", 1),), edges=(Edge("a", "z"),))
