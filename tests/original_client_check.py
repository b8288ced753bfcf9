"""The original client, unmodified, against the built host.

Builds `clients/original` (the published `harmoniis-wallet` crate and its
webcash wallet `webylib`, driven through every marketplace call the client
library makes; see that crate's src/main.rs) into target/original-client,
starts the built host with an admin listener on a free port, and runs the
check twice: through `HarmoniisClient::new` (`/api/...`) and `new_direct`
(`/api/v1/...`), each on a fresh server. Exits non-zero when a step fails.
Not run by .ci/run: the crate's dependencies (Bitcoin and Ark wallets, a
GPU miner) take longer to build than CI can spare; run it by hand after
changing a route the client uses.
"""
import os
import pathlib
import subprocess
import sys

from service import running

ROOT = pathlib.Path(__file__).resolve().parent.parent
CRATE = ROOT / "clients" / "original"
TARGET = ROOT / "target" / "original-client"
TOKEN = "original-client-check-admin-token-0123456789"


def main():
    env = dict(os.environ, CARGO_TARGET_DIR=str(TARGET))
    subprocess.run(["cargo", "build", "--manifest-path", str(CRATE / "Cargo.toml")], check=True, env=env)
    binary = TARGET / "debug" / "original-client-check"
    failed = False
    for mode in ([], ["--direct"]):
        with running(admin_token=TOKEN) as (base, admin):
            print(f"== original client{' --direct' if mode else ''} against {base}", flush=True)
            run = subprocess.run([str(binary), base, admin, *mode], env=dict(os.environ, ADMIN_TOKEN=TOKEN))
            failed |= run.returncode != 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
