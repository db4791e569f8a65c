"""rlinf_embodied.envs"""
