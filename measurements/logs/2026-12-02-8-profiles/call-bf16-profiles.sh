set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
D=$OUT/c7; mkdir -p $D
for impl in tl-sorted "gluon up128-s4 down256-s3"; do
  tag=$(echo "$impl" | tr -c 'a-z0-9\n' '-' | cut -c1-20)
  echo "=== ncu bf16 layer $impl $(date -u +%T)"
  timeout 110 ncu --clock-control none --set full -k regex:"gluon_moe_kernel|sorted_moe_kernel|persistent_moe_kernel" -c 2 -o $D/bf16-qwen3-M16384-$tag \
    python3 measurements/scripts/h200_gluon_bf16.py profile --models Qwen3-30B-A3B --M 16384 --impls "$impl" > $D/ncu-$tag.log 2>&1; tail -2 $D/ncu-$tag.log
done
for r in $D/*.ncu-rep; do ncu -i $r --page raw --csv > ${r%.ncu-rep}-raw.csv 2>&1; ncu -i $r --page details > ${r%.ncu-rep}-details.txt 2>&1; rm -f $r; done
grep -h -E "^  [a-z_]+_kernel|Duration|Registers Per" $D/*-details.txt
tar czf $OUT/call7.tar.gz -C $OUT c7 && rm -rf $D
