"""rlinf_embodied.runtime"""
