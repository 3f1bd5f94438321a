# On erase (not upgrade): the CDI spec's hooks would run a gpushare-hook that is gone.
if [ "$1" = 0 ]; then
    rm -f /etc/cdi/gpushare.io-share.json /var/run/cdi/gpushare.io-share.json
fi
