# Makes the state dir now (tmpfiles.d makes it at boot).
if command -v systemd-tmpfiles >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    systemd-tmpfiles --create /usr/lib/tmpfiles.d/gpushare.conf || true
else
    mkdir -p /run/gpushare && chmod 0700 /run/gpushare
fi
# Shares as CDI devices (gpushare.io/share=<mode or profile>) for engines that read CDI specs.
# A /etc/cdi no engine or tool made before is noted as the package's: erasure takes it away
# again once it is empty.
if [ ! -e /etc/cdi ]; then
    mkdir -p /var/lib/gpushare && : >/var/lib/gpushare/made-etc-cdi
fi
gpushare-hook cdi generate --output /etc/cdi >/dev/null ||
    echo "gpushare: the CDI spec was not written (above); run \`gpushare-hook cdi generate --output /etc/cdi\` once the policy loads" >&2
