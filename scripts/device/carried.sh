# Sourced by the device scripts after they set $root: unpacks what pack.sh packed
# (.carry/device.tgz) and points LD_LIBRARY_PATH and $bin at it. A warm device machine
# keeps .carry/device from the call before: it is unpacked again whenever the carried
# archive differs from the one it came from (else a call would run the previous binaries).
sum="$(md5sum "$root/.carry/device.tgz" | cut -d' ' -f1)"
if [ "$(cat "$root/.carry/device/.archive-md5" 2>/dev/null)" != "$sum" ]; then
  rm -rf "$root/.carry/device"
  tar -xzf "$root/.carry/device.tgz" -C "$root/.carry"
  echo "$sum" >"$root/.carry/device/.archive-md5"
fi
export LD_LIBRARY_PATH="$root/.carry/device/lib"
bin="$root/.carry/device/bin"
