"""The built-in floors: what a model must beat, computed exactly in numpy.

``kmer`` (``kmer-1`` .. ``kmer-6``: k-mer spectra) and ``gc_content`` (``gc``: the GC
fraction). May import the bottom floor and ``embedcache.models.base``; no torch.
"""
