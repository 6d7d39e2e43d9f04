"""Data: what a leaderboard version scores, read from pinned sources.

- ``datasets``: the pinned Genomic Benchmarks datasets (``datasets.toml``) and their splits
- ``versions``: leaderboard versions, one TOML file each (``shipped_versions/``)
- ``subsets``: the seeded, stratified draw of a version's items, and its manifest
- ``seqfile``: reading and validating user sequence files (FASTA, text)

Shipped data: ``datasets.toml``, ``shipped_versions/``, ``demo/`` (the bundled sample).

Imports only the bottom floor (``errors``, ``hashing``, ``specs``).
"""
