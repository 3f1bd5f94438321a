# Makes the state dir now (tmpfiles.d makes it at boot).
if command -v systemd-tmpfiles >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    systemd-tmpfiles --create /usr/lib/tmpfiles.d/gpushare.conf || true
else
    mkdir -p /run/gpushare && chmod 0700 /run/gpushare
fi
