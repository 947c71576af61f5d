"""Hugging Face Hub names where a checkpoint folder is accepted: `hf:ORG/NAME` is the folder of
that model's snapshot in the local Hub cache, downloaded first when online (`huggingface_hub`,
imported only for such a name). Offline (HF_HUB_OFFLINE=1) only the cache is read; the cache is
HF_HUB_CACHE, laid out as the Hub lays it out (models--ORG--NAME/refs/main naming a snapshot in
models--ORG--NAME/snapshots/<revision>/). The cache is a place headlab reads but does not own
(`headlab.io.places`): its refs are checked before the Hub's client reads one, and the snapshot
it names, and every link in it, must resolve inside the model's folder of the cache."""

from __future__ import annotations

import os
from pathlib import Path

from headlab.io.places import hub_repository, hub_snapshot

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
        from huggingface_hub.file_download import repo_folder_name
        from huggingface_hub.utils import validate_repo_id
    except ImportError:
        raise RuntimeError(f"{source}: reading Hugging Face Hub names needs huggingface_hub: "
                           "pip install 'headlab[hf]'") from None
    if not name:
        raise ValueError(f"{source!r}: give the model's Hub name after {HUB_PREFIX}, e.g. hf:gpt2 or hf:ORG/NAME")
    try:
        validate_repo_id(name)
        repo = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=name, repo_type="model")
        if os.path.lexists(repo):
            hub_repository(repo)  # its refs, before the Hub's client joins one to a path
        return hub_snapshot(repo, Path(snapshot_download(name, allow_patterns=HUB_FILES))).folder
    except errors.LocalEntryNotFoundError as error:
        reason = (f"the copy in the Hub cache {constants.HF_HUB_CACHE} is incomplete "
                  f"({str(error).strip().splitlines()[0]}): download it again"
                  if type(error).__name__ == "IncompleteSnapshotError" else
                  f"it is not in the Hub cache {constants.HF_HUB_CACHE}"
                  + (" and HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else
                     " and the Hub could not be reached"))
    except (errors.HFValidationError, errors.RepositoryNotFoundError, errors.HfHubHTTPError) as error:
        reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
    raise ValueError(f"{source}: cannot read this Hugging Face model: {reason}")
