# Analyses (filled in with the analysis package).


def analysis_targets():
    return []
