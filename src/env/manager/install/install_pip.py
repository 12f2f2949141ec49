# Phase 2 of an install (see mod.rs), run offline with the environment mounted
# read-write. Reads install.json; the package check (CHECK_CORE) is appended to it and
# prints the answer.
import json, subprocess, sys
cfg = json.load(open('install.json'))
if cfg['pip_wheel']:
    pip = [cfg['python'], cfg['pip_wheel'] + '/pip']
else:
    pip = ['/usr/bin/python3', '-I', '-m', 'pip', '--python', cfg['python']]
cmd = pip + ['install', '--no-index', '--find-links', cfg['wheels'], '--no-input',
             '--disable-pip-version-check', '--progress-bar', 'off',
             '--no-warn-script-location', '--'] + cfg['specs']
proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        universal_newlines=True, errors='replace')
summary = None
for line in proc.stdout:
    sys.stderr.write(line)
    sys.stderr.flush()
    if line.startswith('Successfully installed '):
        summary = line.strip()
rc = proc.wait()
if rc:
    sys.exit(rc)
