# On erase (not upgrade): the CDI spec's hooks would run a gpushare-hook that is gone; the
# backups `configure` kept of gpushare's own files and its record of the files it wrote go too.
if [ "$1" = 0 ]; then
    rm -f /etc/cdi/gpushare.io-share.json /var/run/cdi/gpushare.io-share.json
    # /etc/cdi goes too when the install made it (post_install noted it) and nothing else is in it.
    if [ -f /var/lib/gpushare/made-etc-cdi ]; then
        rmdir /etc/cdi 2>/dev/null || true
        rm -f /var/lib/gpushare/made-etc-cdi
    fi
    rm -f /etc/containers/containers.conf.d/50-gpushare.conf.bak-* \
        /etc/containers/oci/hooks.d/gpushare-*.json.bak-* \
        /etc/containers/oci/hooks.d-podman/gpushare-*.json.bak-* \
        /etc/crio/crio.conf.d/10-gpushare.conf.bak-* \
        /var/lib/gpushare/configured.json
    rmdir /var/lib/gpushare 2>/dev/null || true
fi
