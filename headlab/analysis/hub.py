"""Hugging Face Hub names where a checkpoint folder is accepted: `hf:ORG/NAME` is the folder of
that model's snapshot in the local Hub cache, downloaded first when online (`huggingface_hub`,
imported only for such a name). Offline (HF_HUB_OFFLINE=1) only the cache is read; the cache is
HF_HUB_CACHE, laid out as the Hub lays it out (models--ORG--NAME/refs/main naming a snapshot in
models--ORG--NAME/snapshots/<revision>/)."""

from __future__ import annotations

from pathlib import Path

HUB_PREFIX = "hf:"
# what headlab reads of a checkpoint: config and tokenizer files, the weights as safetensors (no
# .bin/.pt pickles, no other frameworks' copies, which would multiply the download)
HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model"]


def hub_name(source) -> str | None:
    """ORG/NAME of a source spelled hf:ORG/NAME, else None."""
    if isinstance(source, str) and source.startswith(HUB_PREFIX):
        return source[len(HUB_PREFIX):]
    return None


def local_path(source) -> Path:
    """The local path of `source`: a folder or file as given, or the snapshot folder of hf:ORG/NAME.
    A name neither cached nor downloadable is one ValueError line."""
    name = hub_name(source)
    if name is None:
        return Path(source)
    try:
        from huggingface_hub import constants, errors, snapshot_download
    except ImportError:
        raise RuntimeError(f"{source}: reading Hugging Face Hub names needs huggingface_hub: "
                           "pip install 'headlab[hf]'") from None
    if not name:
        raise ValueError(f"{source!r}: give the model's Hub name after {HUB_PREFIX}, e.g. hf:gpt2 or hf:ORG/NAME")
    try:
        return Path(snapshot_download(name, allow_patterns=HUB_FILES))
    except errors.LocalEntryNotFoundError:
        reason = (f"it is not in the Hub cache {constants.HF_HUB_CACHE}"
                  + (" and HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else
                     " and the Hub could not be reached"))
    except (errors.HFValidationError, errors.RepositoryNotFoundError, errors.HfHubHTTPError) as error:
        reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
    raise ValueError(f"{source}: cannot read this Hugging Face model: {reason}")
