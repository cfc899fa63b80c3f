#!/usr/bin/env bash
# Installs a Rust toolchain that builds Cachet prompt templates for wasm32-unknown-unknown on
# Debian 12, where rustup cannot add targets: Debian's rustc-web / cargo-web (1.96) with their
# sources, lld-22 as the linker, and a core + alloc sysroot for the target built once from those
# sources with -Zbuild-std. Idempotent: does nothing when the sysroot is already there.
# Needs root (apt-get, /usr/lib/rustlib). About 2 minutes and ~1.4 GB the first time.
#   scripts/wasm-toolchain.sh
set -euo pipefail
target=wasm32-unknown-unknown
sysroot_lib=/usr/lib/rustlib/$target/lib
if [ -x /usr/bin/rustc ] && [ -x /usr/bin/cargo ] && command -v wasm-ld-22 >/dev/null &&
   ls "$sysroot_lib"/libcore-*.rlib >/dev/null 2>&1 && ls "$sysroot_lib"/liballoc-*.rlib >/dev/null 2>&1; then
  echo "wasm toolchain: ready ($(/usr/bin/rustc --version))"
  exit 0
fi
sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq rustc-web cargo-web rust-web-src lld-22 >/dev/null
# rustc-web's version must match the source it builds the sysroot from.
rustc_v=$(/usr/bin/rustc --version | awk '{print $2}')
src=/usr/src/rustc-$rustc_v/library
[ -d "$src" ] || src=$(ls -d /usr/src/rustc-*/library | head -1)
echo "wasm toolchain: building the $target sysroot with rustc $rustc_v from $src"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/empty/src"
cat > "$work/empty/Cargo.toml" <<'EOF'
[package]
name = "sysroot-seed"
version = "0.0.0"
edition = "2021"

[lib]
crate-type = ["rlib"]

[profile.release]
opt-level = 3
EOF
echo '#![no_std]' > "$work/empty/src/lib.rs"
(
  cd "$work/empty"
  # -Zbuild-std looks for the library sources in the sysroot; point it at Debian's copy.
  mkdir -p "$work/sysroot/lib/rustlib/src/rust"
  ln -s "$src" "$work/sysroot/lib/rustlib/src/rust/library"
  RUSTC_BOOTSTRAP=1 RUSTC=/usr/bin/rustc __CARGO_TESTS_ONLY_SRC_ROOT="$src" \
    /usr/bin/cargo build --release --offline -q --target $target -Zbuild-std=core,alloc \
    --config "target.$target.linker = \"wasm-ld-22\"" 2>/dev/null ||
  RUSTC_BOOTSTRAP=1 RUSTC=/usr/bin/rustc __CARGO_TESTS_ONLY_SRC_ROOT="$src" \
    /usr/bin/cargo build --release -q --target $target -Zbuild-std=core,alloc \
    --config "target.$target.linker = \"wasm-ld-22\""
)
$sudo mkdir -p "$sysroot_lib"
for crate in core alloc compiler_builtins rustc_std_workspace_core; do
  for f in "$work/empty/target/$target/release/deps/lib${crate}-"*.rlib; do
    [ -e "$f" ] && $sudo cp "$f" "$sysroot_lib/"
  done
done
ls "$sysroot_lib"/libcore-*.rlib "$sysroot_lib"/liballoc-*.rlib >/dev/null
echo "wasm toolchain: ready ($(/usr/bin/rustc --version)); sysroot in $sysroot_lib"
