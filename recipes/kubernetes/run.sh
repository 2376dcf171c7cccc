#!/usr/bin/env bash
# Run recipes/kubernetes/indexed-job.yaml: the scatter Job, then (once every index completed) the
# plan Job, then the gather Job, then the finalize Job. A failed stage stops here with its Job left for `kubectl logs`;
# rerunning this script reruns the stages (finished work is kept on the volume and resumed).
#
#   recipes/kubernetes/run.sh [indexed-job.yaml] [kubectl args...]     e.g. -n my-namespace
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
YAML=${1:-$HERE/indexed-job.yaml}
shift $(( $# > 0 ? 1 : 0 ))
command -v kubectl >/dev/null || { echo "run.sh: kubectl not found" >&2; exit 127; }
for stage in scatter plan gather finalize; do
    kubectl "$@" delete job "shardsmith-$stage" --ignore-not-found >/dev/null
    # one document of the file: the Job of this stage
    python3 -c 'import sys, yaml; docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d["metadata"]["name"] == sys.argv[2]]; print(yaml.safe_dump(docs[0]))' \
        "$YAML" "shardsmith-$stage" | kubectl "$@" apply -f -
    echo "run.sh: waiting for shardsmith-$stage" >&2
    while :; do  # Complete, or Failed (an index out of retries): never wait out a timeout on a failure
        state=$(kubectl "$@" get "job/shardsmith-$stage" -o jsonpath='{.status.conditions[?(@.status=="True")].type}')
        case " $state " in
            *" Complete "*) break ;;
            *" Failed "*) echo "run.sh: shardsmith-$stage failed: kubectl $* logs job/shardsmith-$stage" >&2; exit 1 ;;
        esac
        sleep 10
    done
done
echo "run.sh: done" >&2
