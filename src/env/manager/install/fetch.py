# Phase 1 of an install (see mod.rs), run by the image's Python in a container with
# the network and no environment. Reads fetch.json; its last line of stdout is JSON.
import json, re, subprocess, sys
cfg = json.load(open('fetch.json'))
pip = ['/usr/bin/python3', '-I', '-m', 'pip']
quiet = ['--disable-pip-version-check', '--no-input']
cmd = pip + ['download'] + quiet + ['--progress-bar', 'off', '--only-binary=:all:',
      '--python-version', cfg['python_version'], '--implementation', 'cp']
for p in cfg['platforms']:
    cmd += ['--platform', p]
cmd += ['--dest', cfg['dest'], '--'] + cfg['specs']
proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        universal_newlines=True, errors='replace')
missing, wheel_versions = [], {}
for line in proc.stdout:
    sys.stderr.write(line)
    sys.stderr.flush()
    m = re.match(r'ERROR: Could not find a version that satisfies the requirement (\S+) \(from versions: (.*)\)', line)
    if m:
        wheel_versions[m.group(1)] = m.group(2)
    m = re.match(r'ERROR: No matching distribution found for (\S+)', line)
    if m:
        missing.append(m.group(1))
rc = proc.wait()
if rc == 0 and cfg['own_pip']:
    # The environment's Python is one the image's pip cannot run: a pip wheel for it.
    pcmd = pip + ['download'] + quiet + ['--progress-bar', 'off', '--only-binary=:all:',
           '--no-deps', '--python-version', cfg['python_version'], '--implementation', 'cp',
           '--dest', cfg['tools'], '--', 'pip']
    rc = subprocess.run(pcmd, stdout=sys.stderr).returncode
answer = {'ok': rc == 0, 'missing': []}
for req in (missing if rc else []):
    name = re.match(r'[A-Za-z0-9._-]*', req).group(0)
    versions = None
    if name:
        r = subprocess.run(pip + ['index', 'versions'] + quiet + ['--', name],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           universal_newlines=True, errors='replace')
        for l in r.stdout.splitlines() if r.returncode == 0 else []:
            if l.startswith('Available versions:'):
                versions = l.split(':', 1)[1].strip()
    answer['missing'].append({'requirement': req, 'wheel_versions': wheel_versions.get(req),
                              'versions': versions})
print(json.dumps(answer))
