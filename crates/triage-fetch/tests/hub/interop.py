"""Python's huggingface_hub on the hub cache triage shares, for tests/hub/python.rs.

`download CACHE REPO FILE...` fetches the files from $HF_ENDPOINT into CACHE with hf_hub_download;
`cached CACHE REPO FILE...` finds them in CACHE with try_to_load_from_cache and
hf_hub_download(local_files_only=True), which must agree. Prints {file: path} as JSON.
"""
import json
import sys

from huggingface_hub import hf_hub_download, try_to_load_from_cache


def main():
    mode, cache, repo, *files = sys.argv[1:]
    paths = {}
    for name in files:
        if mode == "download":
            paths[name] = hf_hub_download(repo, name, cache_dir=cache)
            continue
        found = try_to_load_from_cache(repo, name, cache_dir=cache)
        assert isinstance(found, str), f"{name}: try_to_load_from_cache gave {found!r}"
        local = hf_hub_download(repo, name, cache_dir=cache, local_files_only=True)
        assert local == found, (local, found)
        paths[name] = found
    print(json.dumps(paths))


main()
