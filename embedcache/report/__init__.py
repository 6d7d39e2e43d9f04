"""Report: an evaluation and its analyses as tables, figures and one HTML page.

- ``parts``: Table, Plot and Html, the objects a notebook cell shows
- ``tables``: the board's tables (leaderboard, per dataset, floors, probes) and caveats
- ``analysis_tables``: tables and figures of the analyses (clean, clusters, curves, layers)
- ``robustness_tables``: agreement between models, items all get wrong, accuracy_rc
- ``overlap``: the board's Overlap column (catalogue corpora, a user's declarations)
- ``home``: the reports home page, ``reports/index.html``
- ``figures``: scores with CI bars, paired differences, PCA projection
- ``provenance``: run parameters, store keys, provenance, model keys
- ``sections``: the page's sections in order, and the page
- ``published``: published results (``published.toml``), context never ranked
- ``render``: notebook -> papermill -> HTML
- ``export``: a model's vectors for a version as Parquet or npz

Imports anything below it (bottom floor, ``data``, ``models``, ``store``, ``engine``,
``analysis``); never ``cli``.
"""
