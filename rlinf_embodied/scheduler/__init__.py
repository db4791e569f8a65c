"""rlinf_embodied.scheduler"""
