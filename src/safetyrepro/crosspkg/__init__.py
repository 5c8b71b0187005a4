"""Other evaluation packages: import their per-item results for certify (:mod:`.importers`),
the run's items as their local datasets (:mod:`.localdata`), and the cross-package stage
(:mod:`.stage`) that scores the nominal configuration in each package. Modules import lazily:
lm-eval and inspect_ai are loaded only by the functions that need them."""
