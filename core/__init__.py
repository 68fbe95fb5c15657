"""Argus core: the vocabulary and contracts every other package builds on. Imports nothing of ours."""
