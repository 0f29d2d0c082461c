# Sourced by the device scripts after they set $root: unpacks what pack.sh packed
# (.carry/device.tgz, once) and points LD_LIBRARY_PATH and $bin at it.
[ -d "$root/.carry/device" ] || tar -xzf "$root/.carry/device.tgz" -C "$root/.carry"
export LD_LIBRARY_PATH="$root/.carry/device/lib"
bin="$root/.carry/device/bin"
