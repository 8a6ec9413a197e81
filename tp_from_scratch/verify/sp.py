"""Sequence-parallel checks (filled below)."""


def cases(Case):
    return []
