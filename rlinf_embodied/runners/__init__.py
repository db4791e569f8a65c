"""rlinf_embodied.runners"""
