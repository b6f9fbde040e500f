#!/usr/bin/env bash
# The same commands through two prep binaries must write the same bytes: synth 1M, convert of
# Fashion-MNIST (shards and colmajor) and of an image folder. Prints one md5 per dataset (over its
# files' sums, the manifest's provenance aside: it names the command line) for each binary.
#
#   scripts/same-bytes.sh OLD NEW DIR IMAGES   (IMAGES: a folder of class folders of images)
set -euo pipefail
old=$1 new=$2 dir=$3 images=$4
fm=/usr/share/datasets/fashion-mnist
rm -rf "$dir"; mkdir -p "$dir"
digest() {  # one md5 over every file's md5 (the manifest without its provenance)
  (cd "$1" && find . -type f ! -name manifest.json ! -name '.prep*' | sort | xargs md5sum
   python3 -c 'import json,sys; m=json.load(open("manifest.json")); m.pop("provenance",None); m.pop("checksum",None); print(json.dumps(m,sort_keys=True))') | md5sum | cut -d' ' -f1
}
for which in old new; do
  bin=${!which}
  d=$dir/$which
  "$bin" synth --train 1000000 --test 10000 --out "$d/synth" --quiet
  "$bin" convert "$fm" --out "$d/fm" --quiet
  "$bin" convert "$fm" --out "$d/fmc" --format colmajor --quiet
  "$bin" convert "$images" --out "$d/imgs" --size 16 --quiet
done
printf '| dataset | old | new |\n| --- | --- | --- |\n'
status=0
for ds in synth fm fmc imgs; do
  a=$(digest "$dir/old/$ds"); b=$(digest "$dir/new/$ds")
  printf '| %s | %s | %s |\n' "$ds" "$a" "$b"
  [ "$a" = "$b" ] || status=1
done
rm -rf "$dir/old/synth" "$dir/new/synth"
exit $status
