"""`llogos batch`'s job: a file of prompts in, a file of results out, on this machine or across a Ray cluster."""
