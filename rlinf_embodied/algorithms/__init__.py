"""rlinf_embodied.algorithms"""
