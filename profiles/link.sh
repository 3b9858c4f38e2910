#!/usr/bin/env bash
# `snakemake --profile slurm`, as Snakemake users type it (make setup runs this): Snakemake looks for a profile given
# by name in the working directory, then in its user config folder ($XDG_CONFIG_HOME/snakemake, else
# ~/.config/snakemake), then /etc/xdg/snakemake. This links the checkout's profiles/slurm into the user folder, as
# Snakemake itself names it. A profile already there is never replaced (a link left by a checkout since deleted is
# no profile, and is): one line then says which profile `--profile slurm` uses.
# Usage: profiles/link.sh PYTHON (the venv's, which has Snakemake)
set -euo pipefail
python=${1:?usage: profiles/link.sh PYTHON}
here="$(cd "$(dirname "$0")" && pwd)"
folder="$("$python" -c 'from snakemake.cli import get_appdirs; print(get_appdirs().user_config_dir)')"
mkdir -p "$folder"
for name in slurm; do
    ours="$here/$name" dest="$folder/$name"
    if [ -L "$dest" ] && [ "$(readlink -f "$dest")" = "$ours" ]; then
        continue
    elif [ -L "$dest" ] && [ ! -e "$dest" ]; then
        rm "$dest"
    elif [ -e "$dest" ]; then
        echo "profiles: snakemake --profile $name uses $dest (yours, left alone); this checkout's: --profile $ours"
        continue
    fi
    ln -s "$ours" "$dest"
    echo "profiles: linked $dest -> $ours: snakemake --profile $name runs this checkout's"
done
