"""rlinf_embodied.workers"""
