# Report (filled in with the analysis package).
