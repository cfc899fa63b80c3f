#!/usr/bin/env bash
# Builds a Cachet prompt template crate for wasm32-unknown-unknown and prints the .wasm path.
#   scripts/build-template.sh examples/templates/support-bot [out.wasm]
# Installs the toolchain first if needed (scripts/wasm-toolchain.sh). Template crates use
# `cachet-guest-sdk` and `crate-type = ["cdylib"]` (see examples/templates/).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
crate=$(cd "${1:?usage: build-template.sh CRATE_DIR [OUT.wasm]}" && pwd)
bash "$here/wasm-toolchain.sh" >&2
target_dir=${CARGO_TARGET_DIR_WASM:-$here/../target/wasm-templates}
name=$(sed -n 's/^name *= *"\(.*\)"/\1/p' "$crate/Cargo.toml" | head -1 | tr - _)
# Debian's toolchain, not rustup's: it has the wasm32 sysroot this machine can have.
env -u RUSTUP_TOOLCHAIN -u CARGO RUSTC=/usr/bin/rustc CARGO_TARGET_DIR="$target_dir" \
  /usr/bin/cargo build --quiet --release --manifest-path "$crate/Cargo.toml" \
  --target wasm32-unknown-unknown \
  --config 'target.wasm32-unknown-unknown.linker = "wasm-ld-22"' \
  --config 'target.wasm32-unknown-unknown.rustflags = ["-C", "link-arg=-zstack-size=65536"]' \
  --config 'profile.release.opt-level = 3' --config 'profile.release.panic = "abort"' >&2
wasm="$target_dir/wasm32-unknown-unknown/release/$name.wasm"
if [ -n "${2:-}" ]; then cp "$wasm" "$2"; wasm=$2; fi
echo "$wasm"
