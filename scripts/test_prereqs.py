"""Install what the test suite needs beyond Python packages (run by `make test`).

Kept in one place so `make test` on a fresh machine and CI do the same thing. Each step is idempotent and
quick when its prerequisite is already there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
PROMTOOL = Path(__file__).resolve().parent.parent / "var" / "tools" / "promtool"


def ensure_chromium() -> None:
    """Debian's chromium for the browser tests (Playwright drives it; no browser download is possible here).

    Installed with apt as root when missing; elsewhere the browser tests skip themselves and say why.
    """
    if CHROMIUM.exists():
        return
    if not shutil.which("apt-get") or os.geteuid() != 0:
        print(f"test_prereqs: {CHROMIUM} is missing and cannot be installed here; browser tests will skip")
        return
    print("test_prereqs: installing Debian's chromium for the browser tests")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=True, env=env)


def ensure_cjk_font() -> None:
    """A Chinese font for chromium (Debian's fonts-wqy-microhei), so the Simplified Chinese pages in the browser
    tests' screenshots and in ``python -m portal.screenshots`` show characters, not empty boxes."""
    if Path("/usr/share/fonts/truetype/wqy/wqy-microhei.ttc").exists():
        return
    if _apt("install", "-y", "-qq", "fonts-wqy-microhei"):
        print("test_prereqs: installed fonts-wqy-microhei for the Chinese pages")


def _apt(*args: str) -> bool:
    if not shutil.which("apt-get") or os.geteuid() != 0:
        return False
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(["apt-get", *args], env=env).returncode == 0


def ensure_deploy_validators() -> None:
    """Caddy and promtool for tests/deploy (`caddy adapt`, `promtool check` and `promtool test rules`).

    Caddy from Debian. promtool is unpacked from Debian's prometheus package into var/tools/ rather than
    installed, so no Prometheus server gets set up. Where neither can be had those tests skip and say why.
    """
    if not shutil.which("caddy"):
        print("test_prereqs: installing Debian's caddy for the deployment tests")
        if not (_apt("update", "-qq") and _apt("install", "-y", "-qq", "--no-install-recommends", "caddy")):
            print("test_prereqs: caddy could not be installed; the Caddyfile test will skip caddy adapt")
    if shutil.which("promtool") or PROMTOOL.exists():
        return
    print(f"test_prereqs: unpacking promtool from Debian's prometheus package into {PROMTOOL.parent}")
    with tempfile.TemporaryDirectory() as scratch:
        for attempt in range(2):
            if not shutil.which("apt-get"):
                break
            if attempt:  # a fresh machine's package lists may be missing or stale
                _apt("update", "-qq")
            subprocess.run(["apt-get", "download", "-qq", "prometheus"], cwd=scratch)
            if list(Path(scratch).glob("prometheus_*.deb")):
                break
        packages = list(Path(scratch).glob("prometheus_*.deb"))
        if not packages:
            print("test_prereqs: promtool could not be fetched; the promtool tests will skip")
            return
        subprocess.run(["dpkg-deb", "-x", str(packages[0]), f"{scratch}/root"], check=True)
        PROMTOOL.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f"{scratch}/root/usr/bin/promtool", PROMTOOL)


#: What the distributed-training tests run (tests/distributed): Debian's CPU PyTorch (gloo, torchrun), Open MPI
#: with mpi4py, and nftables for the agents' network isolation.
WORKLOAD_PACKAGES = {
    "python3-torch": ("/usr/bin/torchrun",),
    "openmpi-bin": ("/usr/bin/mpirun",),
    "python3-mpi4py": ("/usr/lib/python3/dist-packages/mpi4py",),
    "nftables": ("/usr/sbin/nft",),
}


def ensure_workload_frameworks() -> None:
    """The frameworks the distributed-training tests launch, from Debian (installed as root when missing)."""
    missing = [name for name, paths in WORKLOAD_PACKAGES.items() if not all(Path(p).exists() for p in paths)]
    if not missing:
        return
    print(f"test_prereqs: installing {', '.join(missing)} for the distributed-training tests")
    if not (_apt("update", "-qq") and _apt("install", "-y", "-qq", "--no-install-recommends", *missing)):
        print("test_prereqs: could not install them; the distributed-training tests will fail and say so")


def main() -> None:
    ensure_chromium()
    ensure_cjk_font()
    ensure_deploy_validators()
    ensure_workload_frameworks()


if __name__ == "__main__":
    sys.exit(main())
