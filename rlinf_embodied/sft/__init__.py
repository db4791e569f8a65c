"""SFT -> RL on ManiSkill: motion-planning demonstrations (ManiSkill HDF5 trajectories),
behaviour cloning through the policy contract, held-out evaluation, the RL stage's step-0
gate and RL fine-tuning from the SFT checkpoint (:mod:`rlinf_embodied.sft.pipeline`)."""
