"""rlinf_embodied.policies"""
