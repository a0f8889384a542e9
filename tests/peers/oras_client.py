"""Independent OCI client for the cross-checks: oras-py (PyPI `oras`).

  oras_client.py push HOST REF CONFIG_FILE:MEDIATYPE FILE:MEDIATYPE... [--user U --password P]
  oras_client.py pull HOST REF OUTDIR [--user U --password P] [--token]

REF is registry/repo:tag without a scheme. Plain HTTP (loopback registries only).
"""
import argparse
import os
import shutil
import sys
import tempfile

import oras.client


def client(args):
    backend = "token" if args.token or not args.user else "basic"
    c = oras.client.OrasClient(hostname=args.host, insecure=True, auth_backend=backend)
    if args.user:
        c.auth.set_basic_auth(args.user, args.password)
    return c


def main():
    p = argparse.ArgumentParser()
    p.add_argument("op", choices=["push", "pull"])
    p.add_argument("host")
    p.add_argument("ref")
    p.add_argument("rest", nargs="*")
    p.add_argument("--user")
    p.add_argument("--password")
    p.add_argument("--token", action="store_true", help="registry uses token auth")
    args = p.parse_args()
    c = client(args)
    if args.op == "push":
        config, layers = args.rest[0], args.rest[1:]
        # oras-py names each layer after its file; run from their directory.
        staging = tempfile.mkdtemp()
        files = []
        for layer in layers:
            path, media = layer.rsplit(":", 1)
            shutil.copy(path, staging)
            files.append(f"{os.path.basename(path)}:{media}")
        os.chdir(staging)
        c.push(
            target=args.ref,
            files=files,
            manifest_config=config,
            disable_path_validation=True,
        )
    else:
        (outdir,) = args.rest
        for f in c.pull(target=args.ref, outdir=outdir):
            print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
