"""Analysis: from stored vectors to scores, intervals and the analyses beside the board.

- ``selection``: which store keys a board scores, their display names, floors
- ``vectors``: reading a subset's vectors from the store, all present, in chunks
- ``probe``: the logistic probe (C by cross-validation inside train)
- ``resampling``: bootstrap resamples as counts, per dataset
- ``bootstrap``: item and cluster bootstrap intervals of every model's scores
- ``paired``: paired differences, significance ranks, subset gaps
- ``evaluation``: :func:`evaluate` a subset into an :class:`Evaluation`
- ``results``: the ``results.csv`` frame and its atomic writer
- ``leakage`` (with ``_overlap``): duplicate audit of test items against train
- ``clusters``, ``clean``: cluster-aware intervals, leakage-clean accuracy
- ``curves``, ``layers``, ``pretraining``: label efficiency, layer sweep, pretraining gain
- ``predictions``: per-item predictions (predictions.parquet), agreement, items all get wrong
- ``rc``: reverse-complement robustness (accuracy_rc, strand cosines)
- ``suite``: run every analysis for a report

Imports the bottom floor, ``data``, ``models`` and ``store``; never ``engine``,
``report`` or ``cli``.
"""
