// Salts for the SHA-512 crypt hashes of `init.users[].passwordFrom`.
//
// Why derived, and from what: a seed must be a pure function of its inputs,
// or the image would be rewritten (and re-hashed, re-attached) on every
// reconcile; so no random salt per render. The default salt is derived from
// the VMI's uid and the user name only — deliberately NOT from the password
// or a hash of it: a salt is stored in clear next to the hash, and a salt
// computed from the password would hand an attacker a fast, unsalted hash of
// it, defeating the 5000 SHA-512 rounds. uid + user still gives every VMI and
// user its own salt (no shared rainbow table, equal passwords hash
// differently); a changed password gives a new hash under the same salt.
// Operators who want salts nobody can predict inject `passwordSalt` (e.g.
// keyed with a node-local secret) through RenderOptions.
import { createHash } from 'node:crypto';
import { SALT_MAX } from '../crypt-sha512.ts';

export interface SaltInput {
  // metadata.uid, or the instance-id when there is no uid (local manifests).
  vmiUid: string;
  user: string;
}

/**
 * The crypt salt for one user of one VMI: 1 to 16 characters of [./0-9A-Za-z], the same for the
 * same input (a seed is a pure function of its inputs).
 */
export type SaltProvider = (input: SaltInput) => string;

const ALPHABET = './0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';

/** The default SaltProvider: 16 characters of SHA-256 over VMI uid and user name, never the password. */
export const deriveSalt: SaltProvider = ({ vmiUid, user }) => {
  const digest = createHash('sha256')
    .update('vmseed/password-salt/v1\0')
    .update(vmiUid)
    .update('\0')
    .update(user)
    .digest();
  let salt = '';
  for (let i = 0; i < SALT_MAX; i++) salt += ALPHABET[digest[i] & 0x3f];
  return salt;
};
