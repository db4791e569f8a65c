"""rlinf_embodied.eval"""
