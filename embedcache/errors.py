"""One base error; each subclass also inherits the builtin a caller would catch."""

from __future__ import annotations


class EmbedcacheError(Exception):
    """Base class of every error embedcache raises on purpose."""


class InvalidSequenceError(EmbedcacheError, ValueError):
    """A sequence is empty or holds a character outside A/C/G/T/N."""


class InvalidLabelError(EmbedcacheError, ValueError):
    """A label is not 0 or 1."""


class ChecksumMismatchError(EmbedcacheError, ValueError):
    """A data file's sha256 differs from the pinned one."""


class DataUnavailableError(EmbedcacheError, FileNotFoundError):
    """A dataset cannot be found locally and the hub cannot be reached."""


class VersionSpecError(EmbedcacheError, ValueError):
    """A leaderboard version file is malformed or names something unknown."""


class SubsetDrawError(EmbedcacheError, ValueError):
    """A draw asks for more items than the pool holds."""


class StoreError(EmbedcacheError, OSError):
    """The embedding store cannot be opened or written."""


class DimensionMismatchError(EmbedcacheError, ValueError):
    """Vectors disagree with the dimension or dtype already stored for a key."""


class CorruptStoreError(EmbedcacheError, OSError):
    """A run failed its checksum or is truncated; its data is not trusted."""


class InvalidHashError(EmbedcacheError, ValueError):
    """A sequence hash is not a 64-character lowercase sha256 hex digest."""


class InvalidVectorError(EmbedcacheError, ValueError):
    """Vectors given to the store are not finite real numbers."""


class MissingEmbeddingsError(EmbedcacheError, LookupError):
    """Vectors were asked for that are not in the store."""


class UnknownModelError(EmbedcacheError, LookupError):
    """A model name is neither built in, a local directory, nor loadable from the hub."""


class SequenceTooLongError(EmbedcacheError, ValueError):
    """A sequence exceeds the model's context and no truncation policy was chosen."""


class InputFileError(EmbedcacheError, ValueError):
    """An input file of sequences is empty or unreadable."""


class AdapterOptionError(EmbedcacheError, ValueError):
    """An embedding option (dtype, layer, rc mode, ...) is unknown or does not fit the model."""


class DeviceUnavailableError(EmbedcacheError, RuntimeError):
    """The requested compute device is not present on this machine."""


class ProbeError(EmbedcacheError, ValueError):
    """A probe cannot be fitted or scored on the data it was given."""


class CheckpointError(EmbedcacheError, ValueError):
    """A model checkpoint lacks a tensor, holds one of the wrong shape, or has a config it cannot run."""


class AnalysisInputError(EmbedcacheError, ValueError):
    """An analysis got inputs that do not describe the same items (e.g. audit vs scores)."""


class AmbiguousModelError(EmbedcacheError, LookupError):
    """A model name matches several keys in the store where one is needed."""


class ExportError(EmbedcacheError, ValueError):
    """An export cannot be written as asked (e.g. an unknown output format)."""


class InvalidAliasError(EmbedcacheError, ValueError):
    """A display alias given to the store is not a short printable name."""


class ClusterError(EmbedcacheError, RuntimeError):
    """A Dask cluster cannot be started or reached, or a work unit failed on a worker."""


class StoreUnavailableError(StoreError):
    """The object store kept failing an operation (after retries); nothing half-written is visible."""


class StoreFullError(StoreError):
    """The store's disk is full (ENOSPC); earlier commits are intact."""
