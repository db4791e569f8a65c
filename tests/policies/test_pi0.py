"""Tiny π0 / π0.5 instances behind the policy contract (policies/pi0*.py).

Tiny presets keep the published module structure and parameter names (SigLIP tower, PaliGemma
Gemma, Gemma action expert); everything runs on CPU in float32 in a few seconds.
"""

import pytest
import torch
from rlinf_embodied.policies import build_policy, load_policy, save_policy
from rlinf_embodied.policies.base import SpaceSpec
from rlinf_embodied.policies.pi0_inputs import PiNormalizer, pi_prompt, preprocess_images, state_bins
from rlinf_embodied.policies.pi0_sampling import sde_sigmas, time_grid

from rlinf_embodied.algorithms.losses import ppo_loss
from rlinf_embodied.config import ConfigError, load_config
from rlinf_embodied.policies.configuration_pi0 import Pi05PolicyConfig, Pi0PolicyConfig

pytestmark = pytest.mark.timeout(300)

N, IMG = 4, 48
SPEC = SpaceSpec(action_low=[-1.0] * 7, action_high=[1.0] * 7, state_dim=8,
                 image_shape=(IMG, IMG, 3), wrist_image_shape=(IMG, IMG, 3))
TASKS = ["pick up the black bowl", "open the top drawer", "put the bowl on the plate", "turn on the stove"]
KINDS = [("pi0", "flow_sde"), ("pi05", "flow_sde"), ("pi0", "flow_noise"), ("pi05", "flow_noise")]


def make_obs(seed=0, n=N):
    g = torch.Generator().manual_seed(seed)
    return {
        "main_images": torch.randint(0, 256, (n, IMG, IMG, 3), dtype=torch.uint8, generator=g),
        "wrist_images": torch.randint(0, 256, (n, IMG, IMG, 3), dtype=torch.uint8, generator=g),
        "states": torch.randn(n, 8, generator=g),
        "task_descriptions": TASKS[:n],
    }


def make(kind="pi0", method="flow_sde", **kw):
    cls = Pi0PolicyConfig if kind == "pi0" else Pi05PolicyConfig
    kw = {"action_horizon": 6, "action_chunk": 4, "num_steps": 3, "max_token_len": 120,
          "noise_method": method, **kw}
    torch.manual_seed(0)
    return build_policy(cls(**kw), SPEC).eval()


def ppo_step(p, out, adv, opt):
    """One PPO update of ``p`` on its own rollout ``out`` with advantages ``adv`` (N,)."""
    ev = p.evaluate(out.forward_inputs)
    loss, _ = ppo_loss(logprobs=ev.logprobs, old_logprobs=out.logprobs, advantages=adv)
    opt.zero_grad()
    loss.backward()
    opt.step()


@pytest.mark.parametrize("kind,method", KINDS)
def test_evaluate_reproduces_rollout_logprobs_exactly(kind, method):
    p = make(kind, method, critic=True)
    torch.manual_seed(1)
    out = p.act(make_obs(), "sample")
    assert out.actions.shape == (N, 4, 7) and out.logprobs.shape == (N, 4, 7)
    assert out.actions.abs().max() <= 1.0 and out.values.shape == (N,)
    ev = p.evaluate(out.forward_inputs)
    assert torch.equal(ev.logprobs, out.logprobs)
    assert torch.equal(ev.values, out.values)
    assert ev.logprobs.requires_grad and torch.isfinite(ev.entropy).all()
    fi = out.forward_inputs
    assert fi["chains"].shape == (N, 4, 6, 7)  # N steps + 1, H, D (tiny presets: D = A)
    if method == "flow_sde":  # one stochastic step per sample, its index stored
        assert ((fi["denoise_index"] >= 0) & (fi["denoise_index"] < 3)).all()
    else:
        assert (fi["denoise_index"] == -1).all()


def test_flow_sde_only_the_chosen_step_is_stochastic():
    p = make("pi0", "flow_sde")
    torch.manual_seed(3)
    fi = p.act(make_obs(), "sample").forward_inputs
    chain, idx = fi["chains"], fi["denoise_index"]
    pre = p._prefix(fi)
    vel = p._velocity(pre)
    grid = time_grid(3)
    for j in range(3):
        v, _ = vel(chain[:, j], grid[j].expand(N))
        ode = chain[:, j] - (grid[j] - grid[j + 1]) * v
        det = idx != j
        assert torch.allclose(chain[det, j + 1], ode[det], atol=1e-6)
        if (~det).any():
            assert not torch.allclose(chain[~det, j + 1], ode[~det], atol=1e-3)
    # policy.sde_step fixes the stochastic step: step 0 for every sample, scored exactly
    q = make("pi0", "flow_sde", sde_step=0)
    torch.manual_seed(3)
    out = q.act(make_obs(), "sample")
    fi = out.forward_inputs
    assert (fi["denoise_index"] == 0).all()
    vel = q._velocity(q._prefix(fi))
    for j in (1, 2):  # the later steps are the ODE's
        v, _ = vel(fi["chains"][:, j], grid[j].expand(N))
        assert torch.allclose(fi["chains"][:, j + 1], fi["chains"][:, j] - (grid[j] - grid[j + 1]) * v,
                              atol=1e-6)
    assert torch.equal(q.evaluate(fi).logprobs, out.logprobs)
    with pytest.raises(ConfigError, match="policy.sde_step must be in 0..num_steps-1 = 0..2"):
        Pi0PolicyConfig(num_steps=3, sde_step=3)
    g = time_grid(4)  # 1, 0.75, 0.5, 0.25, 0
    s = sde_sigmas(g, 0.5)  # a sqrt(t / (1 - t)); at t = 1 the denominator uses t_1 (RLinf)
    assert torch.allclose(s, torch.tensor([0.5 * 2.0, 0.5 * 3**0.5, 0.5, 0.5 * (1 / 3) ** 0.5]))


@pytest.mark.parametrize("kind", ["pi0", "pi05"])
def test_greedy_is_deterministic_and_sampling_varies(kind):
    p = make(kind)
    obs = make_obs()
    a, b = p.act(obs, "greedy"), p.act(obs, "greedy")
    assert torch.equal(a.actions, b.actions) and (a.logprobs == 0).all()
    torch.manual_seed(5)
    s1 = p.act(obs, "sample").actions
    s2 = p.act(obs, "sample").actions
    assert not torch.equal(s1, s2)
    torch.manual_seed(5)
    assert torch.equal(p.act(obs, "sample").actions, s1)  # the seeded global generator


def test_fresh_greedy_noise_is_the_ode_from_a_seeded_draw_per_query():
    # policy.greedy_noise=fresh: openpi's inference, the ODE from a new N(0, I) draw per query;
    # evaluations seed it per (task, trial, query) as they seed sampled actions
    from rlinf_embodied.eval.acting import episode_seed, policy_act
    from rlinf_embodied.policies.base import obs_rows

    p = make("pi0", greedy_noise="fresh")
    fixed = make("pi0")
    obs = make_obs()
    assert p.greedy_draws and not fixed.greedy_draws
    torch.manual_seed(11)
    a = p.act(obs, "greedy")
    torch.manual_seed(11)
    noise = torch.randn(N, 6, 7)
    assert torch.equal(a.forward_inputs["chains"][:, 0], noise) and (a.logprobs == 0).all()
    # the ODE from that draw: the fixed-noise policy (same weights) from the same start agrees
    fixed._greedy_noise = noise
    torch.testing.assert_close(fixed.act(obs, "greedy").actions, a.actions, rtol=0, atol=1e-6)
    assert not torch.equal(p.act(obs, "greedy").actions, a.actions)  # a new draw per query
    # in an evaluation: reproducible, the same per env alone or in a batch, seeded per query
    episodes = [("task", trial, 3) for trial in range(N)]
    batch = policy_act(p, "greedy", seed=7)(obs, episodes)
    assert torch.equal(policy_act(p, "greedy", seed=7)(obs, episodes), batch)
    torch.manual_seed(episode_seed(7, "task", 2, 3))
    assert torch.equal(batch[2:3], p.act(obs_rows(obs, [2]), "greedy").actions)
    later = policy_act(p, "greedy", seed=7)(obs, [("task", t, 4) for t in range(N)])
    assert not torch.equal(later, batch)
    with pytest.raises(ConfigError, match="greedy_noise must be one of fixed, fresh"):
        Pi0PolicyConfig(greedy_noise="zero")


@pytest.mark.parametrize("kind,method", KINDS)
def test_one_update_raises_logprob_of_positive_advantage_chunks(kind, method):
    p = make(kind, method)
    torch.manual_seed(2)
    out = p.act(make_obs(), "sample")
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    # One small PPO step (the first-order regime, where each chunk moves with its advantage).
    ppo_step(p, out, adv, torch.optim.Adam([q for q in p.parameters() if q.requires_grad], lr=1e-4))
    with torch.no_grad():
        after = p.evaluate(out.forward_inputs).logprobs.sum((1, 2))
    before = out.logprobs.sum((1, 2))
    assert (after[adv > 0] > before[adv > 0]).all(), (before, after)
    assert (after[adv < 0] < before[adv < 0]).all(), (before, after)


@pytest.mark.parametrize("method", ["flow_sde", "flow_noise"])
def test_a_learned_initial_noise_starts_at_the_prior_and_is_scored_exactly(method):
    from rlinf_embodied.policies.pi0_sampling import gaussian_logprob

    plain, p = make("pi0", method), make("pi0", method, initial_noise_head=True)
    obs = make_obs()
    torch.manual_seed(4)
    ref = plain.act(obs, "sample")
    torch.manual_seed(4)
    out = p.act(obs, "sample")
    # at the start x_0 ~ N(0, I): the SFT policy's samples, draw for draw
    assert torch.equal(out.actions, ref.actions)
    x0 = out.forward_inputs["chains"][:, 0]
    if method == "flow_sde":  # x_0's log-prob is added to the chosen step's
        extra = gaussian_logprob(x0, torch.zeros_like(x0), torch.ones_like(x0))[:, :4]
        torch.testing.assert_close(out.logprobs, ref.logprobs + extra, rtol=0, atol=1e-5)
    else:  # Flow-Noise already scores x_0 under N(0, I)
        torch.testing.assert_close(out.logprobs, ref.logprobs, rtol=0, atol=1e-6)
    assert torch.equal(p.evaluate(out.forward_inputs).logprobs, out.logprobs)  # recomputed exactly
    assert p.execution()["initial_noise"] == "learned"
    assert plain.execution()["initial_noise"] == "standard normal"
    assert (plain.execution()["greedy_noise"], plain.execution()["greedy_noise_seed"]) == ("fixed", 0)


def test_rl_learns_where_the_ode_starts_with_a_learned_initial_noise():
    """An outcome decided by x_0 alone (its first element's sign): Flow-SDE's step log-prob
    carries no expected gradient toward it; x_0's learned mean moves to the rewarded side."""
    p = make("pi0", "flow_sde", initial_noise_head=True)
    obs = make_obs()
    opt = torch.optim.Adam(p.initial_noise_head.parameters(), lr=3e-3)
    torch.manual_seed(6)
    for _ in range(15):
        out = p.act(obs, "sample")
        x00 = out.forward_inputs["chains"][:, 0, 0, 0]
        ppo_step(p, out, torch.where(x00 > 0, 1.0, -1.0), opt)
    with torch.no_grad():
        mean, std = p._x0_dist(p._prefix(p.encode_obs(obs)))
    assert (mean[:, 0, 0] > 0.5).all(), mean[:, 0, 0]
    torch.manual_seed(7)  # greedy (fresh) starts the ODE from the learned distribution too
    g = make("pi0", "flow_sde", initial_noise_head=True, greedy_noise="fresh")
    g.load_state_dict(p.state_dict())
    torch.manual_seed(8)
    start = g.act(obs, "greedy").forward_inputs["chains"][:, 0]
    torch.manual_seed(8)
    torch.testing.assert_close(start, mean + std * torch.randn(N, 6, 7), rtol=0, atol=1e-6)


def test_sft_loss_trains_toward_demonstrated_chunks():
    p = make("pi0", action_horizon=2, action_chunk=2)
    obs = make_obs(n=2)
    target = torch.tensor([[[0.5] * 7, [0.3] * 7], [[-0.5] * 7, [-0.2] * 7]])
    fi = p.encode_obs(obs)

    def held_out_loss():  # the same times and noise every time
        torch.manual_seed(123)
        with torch.no_grad():
            return float(sum(p.sft_loss(fi, target).loss for _ in range(4)))

    before = held_out_loss()
    opt = torch.optim.Adam(p.parameters(), lr=3e-3)
    torch.manual_seed(0)
    for _ in range(40):
        loss = p.sft_loss(fi, target).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert held_out_loss() < 0.75 * before  # 4.58 -> 3.07 here (seeded, deterministic)
    with pytest.raises(ValueError, match="action_horizon"):
        p.sft_loss(fi, torch.zeros(2, 3, 7))


def test_save_policy_load_policy_gives_identical_outputs(tmp_path):
    p = make("pi05", critic=True)
    with torch.no_grad():
        p.normalizer.action_q01.fill_(-0.5)  # statistics are buffers: they travel with the weights
    save_policy(p, tmp_path)
    q = load_policy(tmp_path).eval()
    obs = make_obs()
    a, b = p.act(obs, "greedy"), q.act(obs, "greedy")
    assert torch.equal(a.actions, b.actions) and torch.equal(a.values, b.values)


def test_a_flow_sde_checkpoint_samples_with_flow_noise_in_the_gate(tmp_path):
    """The step-0 gate's sampled copy of a Flow-SDE SFT checkpoint for a Flow-Noise RL run
    (policy_overrides noise_method): the rebuilt policy keeps every weight, gains a fresh noise
    head, saves and loads (it failed with the head's keys missing), and its ODE is unchanged."""
    from rlinf_embodied.sft.gate import _with_config

    p = make("pi0")
    q = _with_config(p, {"noise_method": "flow_noise"}).eval()
    assert q.noise_head is not None and p.noise_head is None
    save_policy(q, tmp_path)
    r = load_policy(tmp_path).eval()
    obs = make_obs()
    assert torch.equal(p.act(obs, "greedy").actions, r.act(obs, "greedy").actions)
    assert r.act(obs, "sample").logprobs is not None


def test_inputs_prompts_bins_normalisation_and_images():
    assert pi_prompt(" pick_up the\nbowl ") == "pick up the bowl\n"
    assert pi_prompt("open it", [0, 255, -1]) == "Task: open it, State: 0 255 -1;\nAction: "
    x = torch.tensor([[-1.5, -1.0, -0.999, 0.0, 0.99, 1.0, 2.0]])
    # numpy: np.digitize(x, np.linspace(-1, 1, 257)[:-1]) - 1
    assert state_bins(x).tolist() == [[-1, 0, 0, 128, 254, 255, 255]]
    nz = PiNormalizer(2, 2, {"state": "mean_std", "action": "quantiles"}, "openpi")
    nz.set_stats("state", {"mean": [1.0, 2.0], "std": [2.0, 4.0]})
    nz.set_stats("action", {"q01": [0.0, -2.0], "q99": [1.0, 2.0]})
    s = torch.tensor([[3.0, 2.0]])
    assert torch.allclose(nz.normalize("state", s), torch.tensor([[2 / (2 + 1e-6), 0.0]]))
    a = torch.tensor([[0.5, 1.0]])
    assert torch.allclose(nz.unnormalize("action", nz.normalize("action", a)), a, atol=1e-6)
    with pytest.raises(ValueError, match="dims"):
        nz.set_stats("state", {"mean": [0.0], "std": [1.0]})
    img = torch.full((1, 20, 40, 3), 255, dtype=torch.uint8)
    out = preprocess_images(img, 32)
    assert out.shape == (1, 3, 32, 32)
    assert torch.allclose(out[0, :, 16], torch.ones(3, 32)) and (out[0, :, 0] == -1).all()


def test_config_checks_and_registry():
    with pytest.raises(ConfigError, match="action_chunk"):
        Pi0PolicyConfig(action_chunk=60, action_horizon=50)
    with pytest.raises(ConfigError, match="noise_method"):
        Pi0PolicyConfig(noise_method="ddpm")
    with pytest.raises(ConfigError, match="noise_std_min"):
        Pi0PolicyConfig(noise_std_min=0.2, noise_std_max=0.1)
    cfg = load_config(None, ["policy.type=pi05", "policy.num_steps=5"])
    assert isinstance(cfg.policy, Pi05PolicyConfig) and cfg.policy.max_token_len == 200
    with pytest.raises(ValueError, match="wrist"):
        build_policy(Pi0PolicyConfig(), SpaceSpec(action_low=[-1] * 7, action_high=[1] * 7, state_dim=8,
                                                  image_shape=(IMG, IMG, 3)))
    p = make("pi0")
    with pytest.raises(ValueError, match="max_token_len"):
        p.act({**make_obs(n=1), "task_descriptions": ["x" * 200]})
    with pytest.raises(ValueError, match="chains"):
        p.evaluate(p.encode_obs(make_obs()))
    assert p.execution()["head"] == "flow_matching" and p.execution()["action_horizon"] == 6
    assert p.execution()["sample_noise_level"] == p.config.noise_level  # sample mode's, recorded


@pytest.mark.parametrize("name", ["libero_spatial_grpo_pi0_tiny", "libero_spatial_grpo_pi05_tiny",
                                  "libero_spatial_grpo_pi0", "libero_spatial_grpo_pi05"])
def test_shipped_configs_load(name):
    cfg = load_config(f"configs/{name}.yaml")
    assert cfg.policy.type == ("pi05" if "pi05" in name else "pi0")
    if not name.endswith("_tiny"):  # the full-size recipes name the published layout they read
        assert cfg.policy.pretrained and cfg.policy.tokenizer and cfg.policy.train_expert_only


def test_train_expert_only_freezes_the_vlm():
    p = make("pi0", train_expert_only=True, critic=True)
    frozen = {n for n, q in p.named_parameters() if not q.requires_grad}
    assert frozen and all(".paligemma." in f".{n}" for n in frozen)
    assert all(q.requires_grad for n, q in p.named_parameters() if "gemma_expert" in n)
    assert p.critic_parameters() == list(p.value_head.parameters())


@pytest.mark.parametrize("granularity", ["action", "token", "chunk"])
def test_default_sft_loss_is_the_nll_per_action_dimension(granularity):
    """Behaviour cloning calls Policy.sft_loss for every family; the default is the NLL of
    evaluate() per action dim (bitwise what bc.py computed before for action log-probs)."""
    from rlinf_embodied.policies.configuration_actor_critic import MLPPolicyConfig

    spec = SpaceSpec(action_low=[-1.0] * 3, action_high=[1.0] * 3, state_dim=5)
    torch.manual_seed(0)
    p = build_policy(MLPPolicyConfig(action_chunk=2, logprob_granularity=granularity), spec)
    states, actions = torch.randn(6, 5), torch.rand(6, 2, 3) * 1.8 - 0.9
    inputs = p.inputs_from_obs({"states": states})
    out = p.sft_loss(inputs, actions)
    ev = p.evaluate(inputs, actions)
    assert torch.allclose(out.loss, -ev.logprobs.sum() / (6 * 2 * 3)) and out.values.shape == (6,)
    if granularity == "action":
        assert torch.equal(out.loss, -ev.logprobs.mean() / 3)
