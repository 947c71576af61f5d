"""Files that are never half-written, never mistaken and never someone else's: the one part of
headlab that writes, renames or deletes a path (tests/disk/test_one_writer.py checks that nothing
else does). Folders are made by `make_folder`, files by the writers of `files`.

- `files`: atomic, no-follow writes and reads, hashes, names confined below their folder;
- `manifest`: what headlab wrote in a folder, verified on every read, the only list of what it
  may overwrite or delete (`Manifest`, `writing`);
- `locks`: one writer per folder (`FolderLock`), dropped by the kernel when the writer dies;
- `scratch`: a folder filled in private and renamed into place whole (`ScratchFolder`);
- `places`: folders headlab reads but does not own (a Hub cache, a user's checkpoint), read through
  links only while they stay inside (`ReadPlace`, `checkpoint_place`, `hub_snapshot`)."""

from headlab.package import lazy_exports

# Loaded on first use (PEP 562): importing one module of the package loads that module only.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "headlab.io.files": (
        "TEMPORARY_SUFFIX", "TEMPORARY", "CHUNK", "BUFFER", "temporary_path", "fsync_path", "HashingFile",
        "open_temporary", "fill", "stage_file",
        "commit_file", "write_file", "atomic_write_bytes", "atomic_write_text", "open_regular", "append_line",
        "read_regular", "file_digest", "descriptor_digest", "held_path", "parse_json", "mismatch", "below", "inside",
        "make_folder", "make_folders", "remove_verified", "open_new", "silence_stdout"),
    "headlab.io.scratch": ("ScratchFolder",),
    "headlab.io.locks": ("LOCK", "FolderLocked", "FolderLock", "being_written"),
    "headlab.io.manifest": ("FORMAT", "MANIFEST_NAMES", "refuse_foreign", "Manifest", "writing"),
    "headlab.io.places": ("ReadPlace", "checkpoint_place", "checkpoint_file", "hub_repository", "hub_snapshot"),
})
