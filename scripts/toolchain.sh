# Sourced by the scripts: makes the toolchain pinned in rust-toolchain.toml available.
# Machines here cannot download toolchains; when the pinned version is the installed stable
# one, link it under its version name so rustup resolves the pin without a download.
pinned=$(sed -n 's/^channel = "\(.*\)"/\1/p' rust-toolchain.toml)
if ! RUSTUP_TOOLCHAIN="$pinned" rustc --version >/dev/null 2>&1; then
  if [ "$(RUSTUP_TOOLCHAIN=stable rustc --version 2>/dev/null | cut -d' ' -f2)" = "$pinned" ]; then
    rustup toolchain link "$pinned" "$(RUSTUP_TOOLCHAIN=stable rustc --print sysroot)"
  fi
fi
