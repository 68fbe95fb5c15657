#!/usr/bin/env bash
# Installs the Debian packages the real test stack and the demo run: Prometheus, Alertmanager, sshd, and
# chromium (the web page's browser test).
# Idempotent and quick when everything is there; says exactly what to do when it cannot install.
set -euo pipefail

need=()
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/usr/bin/$1" ]; }
have prometheus || need+=(prometheus)
have promtool || need+=(prometheus)
have prometheus-alertmanager || need+=(prometheus-alertmanager)
have amtool || need+=(prometheus-alertmanager)
have sshd || need+=(openssh-server)
have ssh-keygen || need+=(openssh-client)
have ssh || need+=(openssh-client)
have chromium || need+=(chromium)

[ ${#need[@]} -eq 0 ] && exit 0
# unique, in order
mapfile -t pkgs < <(printf '%s\n' "${need[@]}" | awk '!seen[$0]++')
echo "argus: installing Debian packages: ${pkgs[*]}"

if [ "$(id -u)" -eq 0 ]; then
  run=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  run=(sudo -n)
else
  echo "argus: cannot install ${pkgs[*]}: not root and no password-less sudo." >&2
  echo "argus: run 'sudo apt-get install -y --no-install-recommends ${pkgs[*]}' and try again." >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "argus: apt-get not found: install ${pkgs[*]} with this system's package manager." >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${run[@]}" apt-get update -qq
"${run[@]}" apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
# The packages' own services are not used: the stack starts its own processes on loopback ports.
echo "argus: installed ${pkgs[*]}"
