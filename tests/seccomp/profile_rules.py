#!/usr/bin/env python3
"""Turns an OCI / Kubernetes seccomp profile (JSON) into the line format test-profile-bites reads,
with the OCI runtimes' meaning: entries are ORed, the conditions of one entry ANDed, and for
SCMP_CMP_MASKED_EQ "value" is the mask and "valueTwo" what the masked argument must equal.

    profile_rules.py PROFILE.json > RULES

    default ERRNO N            (or: default KILL / TRAP / ALLOW / LOG)
    rule ACTION ERRNO NAME N [ARG OP A B] x N
"""
import json
import sys

OPS = {'SCMP_CMP_NE', 'SCMP_CMP_LT', 'SCMP_CMP_LE', 'SCMP_CMP_EQ', 'SCMP_CMP_GE', 'SCMP_CMP_GT',
       'SCMP_CMP_MASKED_EQ'}
ACTIONS = {'SCMP_ACT_ALLOW': 'ALLOW', 'SCMP_ACT_ERRNO': 'ERRNO', 'SCMP_ACT_KILL': 'KILL',
           'SCMP_ACT_KILL_PROCESS': 'KILL', 'SCMP_ACT_TRAP': 'TRAP', 'SCMP_ACT_LOG': 'LOG'}


def main():
    with open(sys.argv[1], encoding='utf-8') as f:
        doc = json.load(f)
    if doc.get('architectures') not in (None, ['SCMP_ARCH_X86_64']):
        sys.exit('only x86_64 profiles are understood')
    out = ['default %s %d' % (ACTIONS[doc['defaultAction']], doc.get('defaultErrnoRet', 1))]
    for entry in doc['syscalls']:
        action = ACTIONS[entry['action']]
        err = entry.get('errnoRet', 1)
        args = entry.get('args') or []
        for a in args:
            if a['op'] not in OPS:
                sys.exit('unknown operator %s' % a['op'])
        conds = ' '.join('%d %s %d %d' % (a['index'], a['op'], a['value'], a.get('valueTwo', 0)) for a in args)
        for name in entry['names']:
            out.append('rule %s %d %s %d %s' % (action, err, name, len(args), conds))
    print('\n'.join(out))


if __name__ == '__main__':
    main()
