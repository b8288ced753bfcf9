#!/usr/bin/env python3
"""A black-box, model-based check of the whole service, from SPEC.md and
PROTOCOL.md alone (written by an outside probe that never read the code).

Usage: python3 tests/model_check.py [--seed N ...] [--steps 300]
For each seed: starts the built host (target/release/marketplace, the
components of target/plugins) on a fresh data dir and free ports, drives a
seeded random sequence of operations (identities, posts of every type,
comments and private replies, attachments, updates, deletes, votes,
profiles, contracts through every path with both fee policies, cash
replaces, x402, MCP execute, concurrent spends of one secret), compares
every read the API offers against an independent in-memory model (items,
order, paging without gaps while writes interleave, search, aggregates,
contract states, every secret's state and amount: money conserved),
restarts the host (SIGTERM) in the middle and SIGTERMs it once more under
concurrent paid posts, re-checks everything, then stops it. Findings are
printed as 'DEFECT ...' (the check fails) or 'NOTE ...' (a documented
choice where the documents are silent, shown for the record).
"""
import argparse, base64, hashlib, json, os, random, signal, socket, subprocess, sys, tempfile, time
import pathlib
import unicodedata
import requests
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

TARGET = pathlib.Path(__file__).resolve().parent.parent / 'target'
BIN = str(TARGET / 'release' / 'marketplace')
PLUGINS = str(TARGET / 'plugins')
# The compile cache the other checks share: components compiled once.
CACHE = str(TARGET / 'tmp' / 'compile-cache')
UNIT = 10 ** 8

FINDINGS = []
SECRET_USES = {}
ORIGIN = {}
SEEN = set()


def finding(kind, key, msg, **ctx):
    if key in SEEN:
        return
    SEEN.add(key)
    FINDINGS.append({'kind': kind, 'key': key, 'msg': msg, 'ctx': ctx})
    print(f'{kind} [{key}] {msg} :: {json.dumps(ctx, ensure_ascii=False)[:1500]}', flush=True)


def check(cond, key, msg, **ctx):
    if not cond:
        finding('DEFECT', key, msg, **ctx)
    return cond


def units(s):
    s = str(s)
    if '.' in s:
        a, b = s.split('.')
        return int(a) * UNIT + int(b.ljust(8, '0'))
    return int(s) * UNIT


def fmt(u):
    a, b = divmod(u, UNIT)
    if b == 0:
        return str(a)
    return f'{a}.{b:08d}'.rstrip('0')


def sec_amount(secret):
    return units(secret.split(':')[0][1:])


def public_of(secret):
    amt, _, hexs = secret.split(':')
    return f'{amt}:public:{hashlib.sha256(hexs.encode()).hexdigest()}'


# ---------------------------------------------------------------- server
def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, datadir):
        self.port, self.admin_port, self.datadir = free_port(), free_port(), datadir
        self.proc = None
        self.base = f'http://127.0.0.1:{self.port}'
        self.admin = f'http://127.0.0.1:{self.admin_port}'

    def start(self):
        self.out = open(self.datadir + '.log', 'a')
        # The test harness's own variables are not server settings.
        harness = ('MARKETPLACE_TEST_', 'MARKETPLACE_REQUIRE_PG')
        env = {k: v for k, v in os.environ.items() if not k.startswith(harness)}
        env['MARKETPLACE_CACHE_DIR'] = CACHE
        self.proc = subprocess.Popen(
            [BIN, 'serve', '--listen', f'127.0.0.1:{self.port}', '--admin-listen',
             f'127.0.0.1:{self.admin_port}', '--data-dir', self.datadir, '--plugins', PLUGINS],
            stdout=self.out, stderr=self.out, env=env)
        t0 = time.time()
        while time.time() - t0 < 90:
            try:
                r = requests.get(self.base + '/api/health', timeout=2)
                if r.status_code == 200 and r.json().get('status') == 'ok':
                    return
            except Exception:
                pass
            time.sleep(0.3)
        raise RuntimeError('server did not become ready')

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rc = self.proc.wait()
                finding('DEFECT', 'sigterm-hang', 'server did not exit within 30s of SIGTERM')
            check(rc == 0, 'sigterm-rc', 'server exit code after SIGTERM is not 0', rc=rc)
        self.proc = None

    def token(self):
        return open(self.datadir + '/admin.token').read().strip()


# ---------------------------------------------------------------- client
class Ident:
    def __init__(self, rng, nick):
        self.sk = Ed25519PrivateKey.from_private_bytes(bytes(rng.getrandbits(8) for _ in range(32)))
        self.fp = self.sk.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()
        self.nick = nick
        self.used = set()
        self.about = ''
        self.deleted = False

    def sign(self, msg):
        return self.sk.sign(msg.encode()).hex()

    def post_body(self, content):
        """A top-level post of `content` by this identity, freshly signed."""
        return {'author_fingerprint': self.fp, 'content': content, **self.fresh('post:' + content)}

    def fresh(self, msg):
        ts = int(time.time())
        while (msg, ts) in self.used:
            ts -= 1
        self.used.add((msg, ts))
        return {'signature': self.sign(f'{msg}:{ts}'), 'timestamp': ts}


class Api:
    def __init__(self, srv):
        self.srv = srv
        self.s = requests.Session()
        self.log = []

    def req(self, m, p, body=None, secret=None, params=None, raw=None):
        h = {'Content-Type': 'application/json'}
        if secret:
            h['X-Cash-Secret'] = secret
            SECRET_USES.setdefault(public_of(secret), []).append([m, p])
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        r = self.s.request(m, self.srv.base + p, data=data, headers=h, params=params, timeout=30)
        try:
            j = r.json()
        except Exception:
            j = r.content
        import re as _re
        if secret:
            SECRET_USES[public_of(secret)][-1].append(r.status_code)
        self.log.append((m, _re.sub(r'(post_|CTR_)[A-Za-z0-9_-]+', r'\1X', p), r.status_code))
        if r.status_code >= 500:
            finding('DEFECT', f'5xx-{m}-{p.split("/")[2] if p.count("/")>1 else p}', 'server error',
                    method=m, path=p, status=r.status_code, body=str(j)[:500])
        return r.status_code, j, r


# ---------------------------------------------------------------- model
WORDS = ['alpha', 'bravo', 'charlie', 'delta', 'echo']
TYPES = ['general', 'service_offer', 'product_listing', 'service_request']
UNI = ['café', 'naïve', 'Ωmega', '日本語', 'emoji🚀', 'straße', 'Zürich']


class Post:
    def __init__(self, pid, author, content, ptype, keywords, atts, parent, private=False, payload=None,
                 recipient=None):
        self.pid, self.author, self.content, self.ptype = pid, author, content, ptype
        self.keywords, self.atts, self.parent = keywords, atts, parent
        self.deleted = False
        self.private = private
        self.payload, self.recipient = payload, recipient
        self.votes = {}  # actor fp -> up/down
        self.dead_tokens = set()


class Contract:
    def __init__(self, cid, buyer, seller, amount, ref, deadline=None):
        self.cid, self.buyer, self.seller, self.amount, self.ref = cid, buyer, seller, amount, ref
        self.status = 'issued'
        self.history = ['buy']
        self.payout = None
        self.refund = None
        self.cert = None
        self.delivered_text = None
        self.deadline = deadline


ALLOWED = {'issued': {'accept', 'refund'}, 'active': {'deliver', 'release', 'refund'},
           'delivered': {'pickup', 'release', 'refund'}, 'settled': {'pickup'}, 'refunded': {'pickup'}}


def tokens_of(text):
    out, cur = set(), ''
    for ch in unicodedata.normalize('NFC', text).lower():
        if ch.isalnum():
            cur += ch
        else:
            if cur:
                out.add(cur)
            cur = ''
    if cur:
        out.add(cur)
    return out


class Probe:
    def __init__(self, seed, steps, workdir):
        self.rng = random.Random(seed)
        self.seed, self.steps = seed, steps
        self.datadir = os.path.join(workdir, f'data-{seed}')
        self.srv = Server(self.datadir)
        self.api = Api(self.srv)
        self.ids = []          # Ident
        self.byfp = {}
        self.posts = {}        # pid -> Post
        self.order = []        # pids in creation order
        self.contracts = {}
        self.wallet = {}       # secret -> units (unspent, ours)
        self.spent = set()
        self.minted = 0
        self.fees_paid = 0
        self.escrow = 0
        self.fee_earned = 0
        self.tokn = 0
        self.step = 0
        self.nicks = set()
        self.noprobe = 0
        self.policy = 'bid-inclusive'
        self.lastsec = None

    # ------------------------------------------------------------ money
    def mint(self, amount_units):
        r = requests.post(self.srv.admin + '/admin/cash/mint', json={'amount': fmt(amount_units)},
                          headers={'Authorization': 'Bearer ' + self.srv.token()}, timeout=10)
        r.raise_for_status()
        s = r.json()['secret']
        check(sec_amount(s) == amount_units, 'mint-amount', 'minted secret amount differs', s=s)
        self.wallet[s] = amount_units
        self.minted += amount_units
        return s

    def pick(self, price):
        cands = [s for s, a in self.wallet.items() if a >= price]
        exact = [s for s in cands if self.wallet[s] == price]
        if exact and self.rng.random() < 0.5:
            return exact[0]
        if cands and self.rng.random() < 0.8:
            return self.rng.choice(sorted(cands))
        if self.rng.random() < 0.3:
            return self.split(price)
        return self.mint(max(price, UNIT * self.rng.choice([1, 5, 20])))

    def split(self, price):
        """use /api/cash/replace to make an exact secret"""
        big = self.mint(price + UNIT)
        outs = [f'e{fmt(price)}:secret:{os.urandom(32).hex()}', f'e1:secret:{os.urandom(32).hex()}']
        st, j, _ = self.api.req('POST', '/api/cash/replace', {'webcashes': [big], 'new_webcashes': outs})
        if not check(st == 200, 'replace', 'cash replace failed', st=st, j=j):
            return big
        del self.wallet[big]
        self.spent.add(big)
        for o in outs:
            self.wallet[o] = sec_amount(o)
        # replay of the same replace must not create value
        st2, j2, _ = self.api.req('POST', '/api/cash/replace', {'webcashes': [big], 'new_webcashes': outs})
        check(st2 == 400 or (st2 == 200 and False), 'replace-replay', 'replaying a cash replace was accepted',
              st=st2, j=j2)
        return outs[0]

    def paid(self, m, p, body, price, expect=(200, 201), raw=None):
        """perform a paid request with a secret >= price; apply change to wallet."""
        sec = self.pick(price)
        self.lastsec = sec
        # sometimes first hit without payment: must be 402 with the price
        if self.rng.random() < 0.1 and self.noprobe == 0:
            st, j, r = self.api.req(m, p, body, raw=raw)
            if check(st == 402, '402-missing', 'paid route without payment not 402', path=p, st=st, j=j):
                check(j.get('code') == 'payment_required', '402-code', 'wrong 402 code', j=j)
                check(units(j.get('required_amount', '0')) == price or p.endswith('/pickup'), '402-price',
                      '402 required_amount differs from model price', path=p, got=j.get('required_amount'),
                      want=fmt(price))
                check('PAYMENT-REQUIRED' in r.headers or 'payment-required' in r.headers, 'x402-hdr',
                      '402 lacks PAYMENT-REQUIRED header')
        st, j, r = self.api.req(m, p, body, secret=sec, raw=raw)
        if st in expect:
            amt = self.wallet.pop(sec)
            self.spent.add(sec)
            pay = j.get('payment') or {}
            ch = pay.get('change')
            hch = r.headers.get('X-Cash-Change')
            check(ch == hch, 'change-hdr', 'body payment.change differs from X-Cash-Change header',
                  body=ch, hdr=hch)
            if amt > price:
                if check(ch is not None, 'change-missing', 'no change returned for an overpayment', amt=amt,
                         price=price, path=p):
                    check(sec_amount(ch) == amt - price, 'change-amount', 'change amount wrong', paid=fmt(amt),
                          price=fmt(price), change=ch)
                    check(ch.split(':')[0] == 'e' + fmt(sec_amount(ch)), 'change-shortest',
                          'change amount not in shortest form', change=ch)
                    self.wallet[ch] = sec_amount(ch)
                    ORIGIN[public_of(ch)] = ['change', m, p, public_of(sec)]
            else:
                check(ch is None, 'change-exact', 'change returned for exact payment', ch=ch)
            check(units(pay.get('price', '-1')) == price, 'pay-price', 'payment.price differs', pay=pay,
                  want=fmt(price), path=p)
            self.fees_paid += price
            # idempotent replay: identical request returns identical stored answer
            if self.rng.random() < 0.15:
                st2, j2, _ = self.api.req(m, p, body, secret=sec, raw=raw)
                check(st2 == st and j2 == j, 'replay-identical',
                      'identical paid retry did not return the stored answer', path=p, st=st, st2=st2,
                      j2=str(j2)[:300])
        else:
            # failed: nothing spent
            self.verify_secret(sec, False, 'failed-request')
        return st, j, r

    def verify_secret(self, sec, spent, ctx):
        st, j, _ = self.api.req('POST', '/api/cash/health_check', [public_of(sec)])
        if not check(st == 200, 'hc', 'cash health_check failed', st=st, j=j):
            return
        res = j['results'].get(public_of(sec))
        check(res and res.get('spent') == spent, 'secret-state-' + ctx,
              f'secret spent-state wrong after {ctx}', want_spent=spent, got=res)

    def check_wallet(self):
        pubs = {public_of(s): s for s in self.wallet}
        spub = {public_of(s): s for s in self.spent}
        allp = list(pubs) + list(spub)
        for i in range(0, len(allp), 500):
            chunk = allp[i:i + 500]
            st, j, _ = self.api.req('POST', '/api/cash/health_check', chunk)
            if not check(st == 200, 'hc', 'cash health_check failed', st=st):
                return
            check(list(j['results'].keys()) == chunk, 'hc-order', 'health_check results not in request order')
            for pb in chunk:
                res = j['results'][pb]
                if pb in pubs:
                    check(res['spent'] is False and units(res['amount']) == self.wallet[pubs[pb]],
                          'wallet-unspent', 'a secret we hold is not live with its amount', pub=pb, res=res,
                          uses=SECRET_USES.get(pb), origin=ORIGIN.get(pb))
                else:
                    check(res['spent'] is True, 'wallet-spent', 'a secret we spent is not marked spent',
                          pub=pb, res=res)
        total = sum(self.wallet.values())
        check(total + self.fees_paid + self.escrow + self.fee_earned == self.minted,
              'conservation', 'money not conserved in model accounting', total=total, minted=self.minted,
              fees=self.fees_paid, escrow=self.escrow, arb=self.fee_earned)

    # ------------------------------------------------------------ helpers
    def tok(self):
        self.tokn += 1
        n = self.tokn
        s = ''
        for _ in range(6):
            s += chr(ord('a') + n % 26)
            n //= 26
        return 'zq' + s + chr(ord('a') + self.rng.randrange(26)) + chr(ord('a') + self.rng.randrange(26))

    def live_ids(self):
        return [i for i in self.ids if not i.deleted]

    def add_plain_post(self, pid, fp, content):
        """Remember a general post without keywords or attachments the service made."""
        self.posts[pid] = Post(pid, fp, content, 'general', [], [], None)
        self.order.append(pid)

    def alive_posts(self, include_private=False):
        return [self.posts[p] for p in self.order if not self.posts[p].deleted and
                (include_private or not self.posts[p].private)]

    # ------------------------------------------------------------ operations
    def op_register(self, nick=None):
        nick = nick or self.rng.choice(['u', 'User.', 'user_', 'X-']) + str(len(self.ids)) + self.tok()[:4]
        idn = Ident(self.rng, nick)
        body = {'nickname': nick, 'pgp_public_key': idn.fp, 'about': self.rng.choice(['', 'hi ' + nick]),
                'signature': idn.sign(f'register:{nick}')}
        st, j, _ = self.paid('POST', '/api/identity', body, units('0.6'))
        if check(st == 201, 'register', 'identity registration failed', st=st, j=j, nick=nick):
            idn.about = body['about']
            self.ids.append(idn)
            self.byfp[idn.fp] = idn
            self.nicks.add(nick.lower())
            check(j.get('fingerprint') == idn.fp, 'register-fp', 'fingerprint != key hex', j=j)
        return idn

    def op_register_dup(self):
        if not self.ids:
            return
        other = self.rng.choice(self.ids)
        nick = other.nick if self.rng.random() < 0.5 else other.nick.upper()
        idn = Ident(self.rng, nick)
        body = {'nickname': nick, 'pgp_public_key': idn.fp, 'signature': idn.sign(f'register:{nick}')}
        sec = self.pick(units('0.6'))
        st, j, _ = self.api.req('POST', '/api/identity', body, secret=sec)
        if st == 201 and other.deleted:
            self.wallet.pop(sec); self.spent.add(sec)
            ch = j.get('payment', {}).get('change')
            if ch: self.wallet[ch] = sec_amount(ch)
            self.fees_paid += units('0.6')
            idn.about = ''
            self.ids.append(idn); self.byfp[idn.fp] = idn
            return
        if st == 201:
            # case variant accepted: is lookup by nickname case-insensitive?
            self.wallet.pop(sec); self.spent.add(sec)
            ch = j.get('payment', {}).get('change')
            if ch: self.wallet[ch] = sec_amount(ch)
            self.fees_paid += units('0.6')
            idn.about = ''
            self.ids.append(idn); self.byfp[idn.fp] = idn
            finding('NOTE', 'nick-case', 'nickname differing only by case was accepted as a new identity',
                    a=other.nick, b=nick)
            return
        check(st == 409 and j.get('code') == 'conflict', 'dup-nick', 'taken nickname not 409 conflict',
              st=st, j=j)
        self.verify_secret(sec, False, 'dup-nick')

    def make_content(self):
        r = self.rng.random()
        t = self.tok()
        words = ' '.join(self.rng.sample(WORDS, self.rng.randint(1, 3)))
        if r < 0.15:
            u = self.rng.choice(UNI)
            return f'{t} {words} {u}'
        return f'{t} {words} lorem'

    def make_atts(self, listing):
        atts = []
        if listing:
            atts.append({'filename': 'terms.md', 'content': f'# Terms {self.tok()}'})
            atts.append({'filename': self.rng.choice(['service.md', 'product.md', 'skill.md', 'description.md']),
                         'content': f'desc {self.tok()} ' + self.rng.choice(WORDS)})
        if self.rng.random() < 0.3:
            atts.append({'filename': 'notes.txt', 'content': f'plain {self.tok()}', 'attachment_type': 'text/plain'})
        return atts

    def op_post(self, parent=None, content=None, ptype=None, atts=None, expect_ok=True, keywords=None):
        live = self.live_ids()
        if not live:
            self.op_register(); live = self.live_ids()
        author = self.rng.choice(live)
        content = content if content is not None else self.make_content()
        ptype = ptype or (self.rng.choice(TYPES) if parent is None else self.rng.choice(['general', 'comment']))
        listing = ptype in ('service_offer', 'product_listing') and self.rng.random() < 0.7
        atts = atts if atts is not None else self.make_atts(listing)
        kws = keywords if keywords is not None else [self.tok()] if self.rng.random() < 0.5 else []
        body = {'author_fingerprint': author.fp, 'content': content, 'post_type': ptype, 'keywords': kws,
                'attachments': atts}
        if parent:
            body['parent_id'] = parent.pid
        if self.rng.random() < 0.3:
            body['signature'] = author.sign(f'post:{content}')
        else:
            body.update(author.fresh(f'post:{content}'))
        price = units('0.01') if parent else units('0.3')
        if not expect_ok: self.noprobe += 1
        st, j, _ = self.paid('POST', '/api/timeline', body, price)
        if not expect_ok: self.noprobe -= 1
        if parent is not None and parent.deleted:
            check(st == 404, 'comment-deleted-parent', 'comment on a deleted post not 404', st=st, j=j)
            return None
        if not expect_ok:
            return st, j
        if not check(st == 201, 'post', 'post creation failed', uses=SECRET_USES.get(public_of(self.lastsec)),
                     origin=ORIGIN.get(public_of(self.lastsec)), st=st, j=str(j)[:400]):
            return None
        pid = j['post_id']
        p = Post(pid, author.fp, content, ptype, kws, atts, parent.pid if parent else None)
        if self.order:
            check(pid > self.order[-1], 'id-monotonic', 'new post id does not sort after the previous one',
                  prev=self.order[-1], new=pid)
        self.posts[pid] = p
        self.order.append(pid)
        self.compare_post(p, j.get('post'), 'create')
        return p

    def op_private_reply(self):
        alive = self.alive_posts()
        live = self.live_ids()
        if not alive or len(live) < 2:
            return
        parent = self.rng.choice(alive)
        author, rcpt = self.rng.sample(live, 2)
        payload = 'ENC' + self.tok() + ' ' + self.rng.choice(WORDS)
        body = {'author_fingerprint': author.fp, 'content': '', 'post_type': 'private_reply',
                'parent_id': parent.pid, 'recipient_fingerprint': rcpt.fp, 'encrypted_payload': payload,
                **author.fresh(f'post:{payload}')}
        st, j, _ = self.paid('POST', '/api/timeline', body, units('0.01'))
        if check(st == 201, 'private-reply', 'private reply failed', st=st, j=str(j)[:300]):
            pid = j['post_id']
            p = Post(pid, author.fp, '', 'private_reply', [], [], parent.pid, private=True, payload=payload,
                     recipient=rcpt.fp)
            self.posts[pid] = p
            self.order.append(pid)

    def op_update(self):
        alive = [p for p in self.alive_posts() if p.author in self.byfp and not self.byfp[p.author].deleted]
        if not alive:
            return
        p = self.rng.choice(alive)
        author = self.byfp[p.author]
        body = {'post_id': p.pid, 'author_fingerprint': author.fp}
        newc, newk, newa = p.content, p.keywords, p.atts
        what = self.rng.choice(['content', 'keywords', 'attachments', 'all', 'meta'])
        if what in ('content', 'all'):
            newc = self.make_content(); body['content'] = newc
        if what in ('keywords', 'all'):
            newk = [self.tok()]; body['keywords'] = newk
        if what in ('attachments', 'all'):
            newa = self.make_atts(p.ptype in ('service_offer', 'product_listing') and self.rng.random() < 0.5)
            body['attachments'] = newa
        if what == 'meta':
            body['activity_metadata'] = {'k': self.tok()}
        body.update(author.fresh(f'update_post:{p.pid}'))
        # wrong author first sometimes
        if self.rng.random() < 0.2 and len(self.live_ids()) > 1:
            other = self.rng.choice([i for i in self.live_ids() if i.fp != author.fp])
            b2 = dict(body, author_fingerprint=other.fp, **other.fresh(f'update_post:{p.pid}'))
            st, j, _ = self.api.req('POST', '/api/posts/update', b2)
            check(st == 403 and j.get('code') == 'forbidden_party', 'update-other',
                  'update by a non-author not 403 forbidden_party', st=st, j=j)
        st, j, _ = self.api.req('POST', '/api/posts/update', body)
        if check(st == 200, 'update', 'post update failed', st=st, j=str(j)[:300]):
            old = tokens_of(p.content) | set(t for k in p.keywords for t in tokens_of(k)) | \
                  set(t for a in p.atts for t in tokens_of(a['content']))
            p.content, p.keywords, p.atts = newc, newk, newa
            new = self.indexed_tokens(p)
            p.dead_tokens |= {t for t in old - new if t.startswith('zq')}
            post = j.get('post', j)
            self.compare_post(p, post, 'update')

    def op_delete(self):
        alive = [p for p in self.alive_posts(include_private=True) if not self.byfp[p.author].deleted]
        if not alive:
            return
        p = self.rng.choice(alive)
        author = self.byfp[p.author]
        body = {'post_id': p.pid, 'author_fingerprint': author.fp, **author.fresh(f'delete_post:{p.pid}')}
        st, j, _ = self.api.req('POST', '/api/posts/delete', body)
        if check(st == 200, 'delete', 'post delete failed', st=st, j=j):
            p.deleted = True
            # delete again: 404
            body2 = {'post_id': p.pid, 'author_fingerprint': author.fp, **author.fresh(f'delete_post:{p.pid}')}
            st, j, _ = self.api.req('POST', '/api/posts/delete', body2)
            check(st == 404, 'delete-twice', 'deleting a deleted post not 404', st=st, j=j)

    def op_rate(self):
        alive = self.alive_posts()
        live = self.live_ids()
        if not alive or not live:
            return
        p = self.rng.choice(alive)
        actor = self.rng.choice(live)
        vote = self.rng.choice(['up', 'down'])
        body = {'post_id': p.pid, 'actor_fingerprint': actor.fp, 'vote': vote}
        body.update(actor.fresh(f'vote:{p.pid}:{vote}'))
        if self.byfp[p.author].deleted:
            return
        if actor.fp == p.author:
            sec = self.pick(units('0.001'))
            st, j, _ = self.api.req('POST', '/api/profiles/rate', body, secret=sec)
            check(st == 403 and j.get('code') == 'forbidden_party', 'rate-own', 'rating own post not 403',
                  st=st, j=j)
            self.verify_secret(sec, False, 'rate-own')
            return
        st, j, _ = self.paid('POST', '/api/profiles/rate', body, units('0.001'))
        if check(st == 200, 'rate', 'rate failed', st=st, j=j):
            prev = p.votes.get(actor.fp)
            check(j.get('previous_vote') == prev, 'rate-prev', 'previous_vote wrong', got=j.get('previous_vote'),
                  want=prev)
            p.votes[actor.fp] = vote
            up, down = self.author_rating(p.author)
            r = j.get('rating', {})
            check((r.get('up'), r.get('down'), r.get('score')) == (up, down, up - down), 'rate-tally',
                  'author tally after vote differs from model', got=r, want=(up, down))
            pr = j.get('post_rating', {})
            want = (sum(v == 'up' for v in p.votes.values()), sum(v == 'down' for v in p.votes.values()))
            check((pr.get('up'), pr.get('down')) == want, 'rate-post-tally', 'post tally differs', got=pr,
                  want=want)

    def op_rate_deleted(self):
        dead = [p for p in self.posts.values() if p.deleted]
        live = self.live_ids()
        if not dead or not live:
            return
        p = self.rng.choice(dead)
        actor = self.rng.choice(live)
        body = {'post_id': p.pid, 'actor_fingerprint': actor.fp, 'vote': 'up', **actor.fresh(f'vote:{p.pid}:up')}
        sec = self.pick(units('0.001'))
        st, j, _ = self.api.req('POST', '/api/profiles/rate', body, secret=sec)
        check(st == 404, 'rate-deleted', 'rating a deleted post not 404', st=st, j=j)
        if st != 200:
            self.verify_secret(sec, False, 'rate-deleted')
        else:
            self.wallet.pop(sec); self.spent.add(sec)
            ch = j.get('payment', {}).get('change')
            if ch: self.wallet[ch] = sec_amount(ch)
            self.fees_paid += units('0.001')
            if actor.fp != p.author:
                p.votes[actor.fp] = 'up'

    def author_rating(self, fp):
        up = down = 0
        for p in self.posts.values():
            if p.author == fp:
                for v in p.votes.values():
                    up += v == 'up'
                    down += v == 'down'
        return up, down

    def op_profile_update(self):
        live = self.live_ids()
        if not live:
            return
        i = self.rng.choice(live)
        about = self.rng.choice(['', 'about ' + self.tok(), 'ünïcødé ' + '✓' * self.rng.randint(1, 50)])
        body = {'fingerprint': i.fp, 'about': about, **i.fresh(f'update_profile:{i.fp}')}
        st, j, _ = self.api.req('POST', '/api/profile/update', body)
        if check(st == 200, 'profile-update', 'profile update failed', st=st, j=j):
            i.about = about

    # ------------------------------------------------------------ contracts
    def op_buy(self):
        live = self.live_ids()
        refs = [p for p in self.alive_posts() if p.parent is None and self.byfp[p.author] in live]
        if not refs or len(live) < 2:
            return
        ref = self.rng.choice(refs)
        buyers = [i for i in live if i.fp != ref.author]
        buyer = self.rng.choice(buyers)
        amt = self.rng.choice([units('1'), units('0.5'), units('0.00000033'), units('2.12345678'), 7, units('3')])
        cid = ''
        if self.rng.random() < 0.4:
            cid = 'CTR_' + self.tok() + '_' + str(self.seed)
        body = {'buyer_fingerprint': buyer.fp, 'contract_type': self.rng.choice(['service', 'product_digital']),
                'amount': fmt(amt), 'reference_post': ref.pid, 'work_spec': 'do ' + self.tok(),
                'accept_terms': True}
        if cid:
            body['contract_id'] = cid
        body.update(buyer.fresh(f'buy_contract:{buyer.fp}:{ref.pid}:{cid}:'))
        st, j, _ = self.paid('POST', '/api/arbitration/contracts/buy', body, amt)
        if not check(st == 201, 'buy', 'buy failed', st=st, j=str(j)[:400]):
            return
        cid2 = j['contract_id']
        if cid:
            check(cid2 == cid, 'buy-cid', 'client contract id not kept', want=cid, got=cid2)
            # same id again: 409 conflict, nothing spent
            b2 = dict(body, **buyer.fresh(f'buy_contract:{buyer.fp}:{ref.pid}:{cid}:'))
            sec = self.pick(amt)
            st2, j2, _ = self.api.req('POST', '/api/arbitration/contracts/buy', b2, secret=sec)
            check(st2 == 409 and j2.get('code') == 'conflict', 'buy-dup-id', 'taken contract id not 409 conflict',
                  st=st2, j=j2)
            if st2 != 201:
                self.verify_secret(sec, False, 'buy-dup')
        self.fees_paid -= amt  # not a fee: escrow
        self.escrow += amt
        c = Contract(cid2, buyer.fp, ref.author, amt, ref.pid)
        c.policy = self.policy
        c.fee_paid = False
        self.contracts[cid2] = c
        check(j.get('status') == 'issued' and j.get('target_seller_fingerprint') == ref.author, 'buy-answer',
              'buy answer status/seller wrong', j=str(j)[:400])
        self.compare_contract(c)

    def act(self, c, action, actor, extra=None, expect=None, pay=None):
        msgs = {'accept': f'accept:{c.cid}:{actor.fp}', 'deliver': None, 'refund': f'REFUND:{c.cid}',
                'release': f'release:{c.cid}', 'pickup': c.cid}
        body = dict(extra or {})
        if action == 'accept':
            body['seller_fingerprint'] = actor.fp
        else:
            body['actor_fingerprint'] = actor.fp
        msg = msgs[action] if action != 'deliver' else f'deliver:{c.cid}:{body["delivered_text"]}'
        body.update(actor.fresh(msg))
        if pay:
            return self.paid('POST', f'/api/arbitration/contracts/{c.cid}/{action}', body, pay)
        return self.api.req('POST', f'/api/arbitration/contracts/{c.cid}/{action}', body)

    def expected(self, c, action, role):
        s = c.status
        if role == 'stranger':
            return 403
        table = {
            ('accept', 'issued'): 'seller', ('deliver', 'active'): 'seller',
            ('release', 'active'): 'buyer', ('release', 'delivered'): 'buyer',
            ('refund', 'issued'): 'buyer', ('refund', 'active'): 'seller', ('refund', 'delivered'): 'seller',
        }
        if action == 'pickup':
            ok = {('delivered', 'buyer'), ('settled', 'buyer'), ('settled', 'seller'), ('refunded', 'buyer')}
            if (s, role) in ok:
                return 200
            if any((s, r) in ok for r in ('buyer', 'seller')):
                return 403
            return 409
        who = table.get((action, s))
        if who is None:
            return 409
        if who == role:
            return 200
        return 403

    def op_contract_step(self):
        open_ = [c for c in self.contracts.values()]
        if not open_:
            return
        if getattr(self, 'force', None):
            c, action, role = self.force
            return self._step(c, action, role)
        c = self.rng.choice(open_)
        action = self.rng.choice(['accept', 'deliver', 'release', 'refund', 'pickup', 'pickup'])
        r = self.rng.random()
        role = 'buyer' if r < 0.45 else ('seller' if r < 0.9 else 'stranger')
        if self.rng.random() < 0.65:
            good = {'issued': [('accept', 'seller')] * 4 + [('refund', 'buyer')],
                    'active': [('deliver', 'seller')] * 3 + [('release', 'buyer'), ('refund', 'seller'),
                                                               ('release', 'seller')],
                    'delivered': [('pickup', 'buyer')] * 3 + [('release', 'buyer'), ('refund', 'seller')],
                    'settled': [('pickup', 'seller')] * 3 + [('pickup', 'buyer')],
                    'refunded': [('pickup', 'buyer')]}[c.status]
            action, role = self.rng.choice(good)
        return self._step(c, action, role)

    def _step(self, c, action, role):
        if role == 'stranger':
            strangers = [i for i in self.live_ids() if i.fp not in (c.buyer, c.seller)]
            if not strangers:
                return
            actor = self.rng.choice(strangers)
        else:
            actor = self.byfp[c.buyer if role == 'buyer' else c.seller]
            if actor.deleted:
                return
        extra = {}
        if action == 'release' and role == 'seller' and self.rng.random() < 0.7:
            extra['tracking_number'] = 'TRK' + self.tok()
            if self.rng.random() < 0.5: extra['tracking_carrier'] = 'ups'
        if action == 'deliver':
            extra['delivered_text'] = 'delivered ' + self.tok() + ' ' + self.rng.choice(UNI)
        want = self.expected(c, action, role)
        if action == 'release' and role == 'seller':
            want = 200 if c.status == 'active' else (403 if c.status == 'delivered' else 409)
            if 'tracking_number' not in extra and want == 200:
                want = 400
        fee = c.amount * 3 // 100
        pay = None
        if (action == 'pickup' and want == 200 and c.policy == 'pickup-paid' and not c.fee_paid and
                c.status in ('delivered', 'settled') and fee > 0):
            # first pickup must be paid: unpaid attempt first is 402
            st0, j0, _ = self.act(c, action, actor, extra)
            check(st0 == 402 and units(j0.get('required_amount', '0')) == fee, 'pickup-paid-402',
                  'first pickup under pickup-paid without payment not 402 with the fee', st=st0, j=str(j0)[:300],
                  fee=fmt(fee))
            pay = fee
        st, j, _ = self.act(c, action, actor, extra, pay=pay)
        if pay and st == 200:
            c.fee_paid = True
        before = c.status
        ok = check(st == want, f'ctr-{action}-{before}-{role}',
                   f'contract {action} by {role} in {before}: status differs from PROTOCOL 7 table',
                   want=want, got=st, j=str(j)[:300], cid=c.cid)
        if st == 409 and want == 409:
            check(j.get('code') == 'invalid_transition' and j.get('current_status') == c.status and
                  set(j.get('allowed_actions', [])) == ALLOWED[c.status], 'ctr-409-body',
                  '409 body lacks invalid_transition/current_status/allowed_actions', j=j)
        if st == 403 and want == 403:
            check(j.get('code') == 'forbidden_party', 'ctr-403-code', '403 code not forbidden_party', j=j)
        if st != 200:
            self.compare_contract(c)
            return
        # apply
        if action == 'accept':
            c.status = 'active'
        elif action == 'deliver':
            c.status = 'delivered'; c.delivered_text = extra['delivered_text']
        elif action == 'release' and role == 'seller':
            c.status = 'delivered'
            c.delivered_text = (extra['tracking_carrier'] + ': ' if 'tracking_carrier' in extra else '') + extra['tracking_number']
        elif action == 'release':
            c.status = 'settled'
        elif action == 'refund':
            c.status = 'refunded'
        elif action == 'pickup':
            if before == 'delivered':
                c.status = 'settled'
            self.on_pickup(c, role, j, before)
        if action != 'pickup' or before == 'delivered':
            c.history.append(action)
        check(j.get('status') == c.status, 'ctr-answer-status', 'action answer status differs from model',
              got=j.get('status'), want=c.status, action=action)
        self.compare_contract(c)

    def on_pickup(self, c, role, j, before):
        if role == 'buyer' and c.status == 'settled':
            cert = (j.get('certificate_id'), j.get('certificate_secret'))
            check(cert[1] is not None, 'cert', 'buyer pickup on settled lacks certificate', j=str(j)[:300])
            if c.cert is None:
                c.cert = cert
            else:
                check(c.cert == cert, 'cert-repeat', 'repeat buyer pickup returned a different certificate',
                      first=c.cert, now=cert)
            check(j.get('delivered_text') == c.delivered_text, 'cert-text', 'delivered_text differs',
                  got=j.get('delivered_text'), want=c.delivered_text)
        elif role == 'seller':
            pay = j.get('payout')
            want = c.amount - c.amount * 3 // 100 if c.policy == 'bid-inclusive' else c.amount
            check(units(j.get('payout_amount', '-1')) == want, 'payout-amount', 'payout_amount differs',
                  got=j.get('payout_amount'), want=fmt(want), amount=fmt(c.amount))
            if want == 0:
                check(pay is None, 'payout-zero', 'zero payout came with a secret', j=j)
                return
            if check(pay is not None and sec_amount(pay) == want, 'payout', 'payout secret amount wrong',
                     got=pay, want=fmt(want)):
                if c.payout is None:
                    c.payout = pay
                    self.wallet[pay] = want
                    self.escrow -= c.amount
                    self.fee_earned += c.amount - want
                else:
                    check(pay == c.payout, 'payout-repeat', 'repeat payout pickup returned another secret')
        elif role == 'buyer' and c.status == 'refunded':
            ref = j.get('refund')
            if check(ref is not None and sec_amount(ref) == c.amount, 'refund', 'refund secret amount wrong',
                     got=ref, want=fmt(c.amount)):
                if c.refund is None:
                    c.refund = ref
                    self.wallet[ref] = c.amount
                    self.escrow -= c.amount
                else:
                    check(ref == c.refund, 'refund-repeat', 'repeat refund pickup returned another secret')

    def op_legacy_pickup(self):
        cs = [c for c in self.contracts.values() if c.status in ('settled', 'refunded') and not
              getattr(c, 'legacy_done', False)]
        if not cs:
            return
        c = self.rng.choice(cs)
        role = 'seller' if c.status == 'settled' else 'buyer'
        actor = self.byfp[c.seller if role == 'seller' else c.buyer]
        if actor.deleted:
            return
        body = {'actor_fingerprint': actor.fp, 'signature': actor.sign(c.cid)}
        st, j, _ = self.api.req('POST', f'/api/arbitration/contracts/{c.cid}/pickup', body)
        if (role == 'seller' and c.amount * 3 // 100 == c.amount):
            return
        if c.policy == 'pickup-paid' and not c.fee_paid and c.status == 'settled' and c.amount * 3 // 100 > 0:
            return
        if not check(st == 200, 'legacy-pickup', 'first legacy payout/refund pickup not 200', st=st, j=j,
                     role=role):
            return
        before = c.status
        self.on_pickup(c, role, j, before)
        st, j2, _ = self.api.req('POST', f'/api/arbitration/contracts/{c.cid}/pickup', body)
        check(st == 409 and j2.get('code') == 'already_picked_up', 'legacy-pickup-2',
              'second legacy pickup not 409 already_picked_up', st=st, j=j2)
        secret = c.payout if role == 'seller' else c.refund
        if secret and st == 409:
            check(public_of(secret) in json.dumps(j2), 'legacy-pickup-public',
                  'already_picked_up does not carry the public form of the issued secret', j=j2)
        c.legacy_done = True
        # fresh may fetch again
        st, j3, _ = self.act(c, 'pickup', actor)
        check(st == 200 and (j3.get('payout') or j3.get('refund')) == secret, 'fresh-after-legacy',
              'fresh pickup after legacy did not return the same secret', st=st)

    def op_delete_identity(self):
        live = self.live_ids()
        if len(live) < 4:
            return
        i = self.rng.choice(live)
        body = {'fingerprint': i.fp, **i.fresh(f'delete_identity:{i.fp}')}
        st, j, _ = self.api.req('POST', '/api/identity/delete', body)
        if not check(st == 200, 'id-delete', 'identity delete failed', st=st, j=j):
            return
        i.deleted = True
        self.nicks.discard(i.nick.lower())
        st, j, _ = self.api.req('GET', '/api/profile', params={'fingerprint': i.fp})
        check(st == 404, 'id-deleted-profile', 'profile of deleted identity not 404', st=st)
        # a post by the deleted key is refused: 401 auth_invalid, nothing spent
        sec = self.pick(units('0.3'))
        c = 'ghost ' + self.tok()
        st, j, _ = self.api.req('POST', '/api/timeline', {'author_fingerprint': i.fp, 'content': c,
                                                          **i.fresh('post:' + c)}, secret=sec)
        check(st == 401 and j.get('code') == 'auth_invalid', 'deleted-author-post',
              'post by deleted identity not 401 auth_invalid', st=st, j=j)
        self.verify_secret(sec, False, 'deleted-author')
        mine = [p for p in self.alive_posts() if p.author == i.fp]
        if mine:
            st, j, _ = self.api.req('GET', f'/api/posts/{mine[0].pid}')
            if st == 200:
                finding('NOTE', 'deleted-author-nick', 'post of deleted identity: author_nick shown as',
                        nick=j['post'].get('author_nick'))
        # nickname freed: register a new key with the same nickname
        if self.rng.random() < 0.5:
            n = self.op_register(nick=i.nick)

    def op_double_spend(self):
        import threading
        live = self.live_ids()
        if not live:
            return
        sec = self.mint(units('0.3'))
        res = []
        def go(k):
            a = self.rng.choice(live) if False else live[k % len(live)]
            c = f'race {k} ' + self.tok()
            body = a.post_body(c)
            st, j, _ = Api(self.srv).req('POST', '/api/timeline', body, secret=sec)
            res.append((st, j, a.fp, c))
        ths = [threading.Thread(target=go, args=(k,)) for k in range(8)]
        for t in ths: t.start()
        for t in ths: t.join()
        ok = [r for r in res if r[0] == 201]
        check(len(ok) == 1, 'double-spend', 'concurrent use of one secret: not exactly one success',
              statuses=[r[0] for r in res])
        for st, j, fp, c in res:
            if st != 201:
                check(st == 402 and j.get('code') == 'payment_spent', 'race-code', 'loser of a race not 402 spent',
                      st=st, j=j)
        self.wallet.pop(sec); self.spent.add(sec)
        for st, j, fp, c in ok:
            self.fees_paid += units('0.3')
            self.add_plain_post(j['post_id'], fp, c)
        self.order.sort()

    def op_mcp_execute(self):
        live = self.live_ids()
        if not live:
            return
        a = self.rng.choice(live)
        c = 'viamcp ' + self.tok()
        body = a.post_body(c)
        ex = {'endpoint': {'method': 'POST', 'path': '/api/timeline', 'body': body}}
        st, j, _ = self.api.req('POST', '/api/mcp/tools/execute', ex)
        check(st == 402, 'mcp-402', 'execute of a paid target without payment not 402', st=st, j=str(j)[:200])
        st, j, r = self.paid('POST', '/api/mcp/tools/execute', ex, units('0.3'))
        if check(st == 201, 'mcp-exec-paid', 'paid execute of POST /api/timeline failed', st=st, j=str(j)[:300]):
            self.add_plain_post(j['post_id'], a.fp, c)
        # read tool
        if self.order:
            pid = self.order[-1]
            st, j, _ = self.api.req('POST', '/api/mcp/tools/execute', {'endpoint': {'method': 'GET',
                                                                                   'path': f'/api/posts/{pid}'}})
            st2, j2, _ = self.api.req('GET', f'/api/posts/{pid}')
            check(st == st2 and j == j2, 'mcp-exec-get', 'execute GET answer differs from direct GET')

    def op_x402(self):
        live = self.live_ids()
        if not live:
            return
        a = self.rng.choice(live)
        c = 'x402 ' + self.tok()
        body = a.post_body(c)
        st, j, r = self.api.req('POST', '/api/timeline', body)
        pr = json.loads(base64.b64decode(r.headers['PAYMENT-REQUIRED']))
        acc = pr['accepts'][0]
        check(acc['amount'] == str(units('0.3')), 'x402-amount', 'x402 accepts.amount differs', acc=acc)
        sec = self.mint(units('1'))
        pid_key = 'probe-' + self.tok() + '-idempotency'
        sig = {'x402Version': 2, 'accepted': acc, 'payload': {'secret': sec},
               'extensions': {'payment-identifier': {'info': {'id': pid_key}}}}
        hdr = base64.b64encode(json.dumps(sig).encode()).decode()
        raw = json.dumps(body)
        rr = requests.post(self.srv.base + '/api/timeline', data=raw,
                           headers={'PAYMENT-SIGNATURE': hdr, 'Content-Type': 'application/json'})
        if not check(rr.status_code == 201, 'x402-pay', 'x402 payment failed', st=rr.status_code, j=rr.text[:300]):
            self.verify_secret(sec, False, 'x402'); return
        j = rr.json()
        self.wallet.pop(sec); self.spent.add(sec); self.fees_paid += units('0.3')
        resp = json.loads(base64.b64decode(rr.headers['PAYMENT-RESPONSE']))
        ch = resp['extra']['change']
        check(ch and sec_amount(ch) == units('0.7') and resp['transaction'] == public_of(sec), 'x402-resp',
              'PAYMENT-RESPONSE wrong', resp=resp)
        if ch: self.wallet[ch] = sec_amount(ch)
        self.add_plain_post(j['post_id'], a.fp, c)
        # same id, same request -> stored answer
        rr2 = requests.post(self.srv.base + '/api/timeline', data=raw,
                            headers={'PAYMENT-SIGNATURE': hdr, 'Content-Type': 'application/json'})
        check(rr2.status_code == 201 and rr2.json() == j, 'x402-idem', 'payment-identifier retry differs',
              st=rr2.status_code)
        # same id, other request -> 409 idempotency_conflict
        sec2 = self.mint(units('1'))
        sig2 = dict(sig, payload={'secret': sec2})
        body2 = dict(body, content=c + ' other', **a.fresh('post:' + c + ' other'))
        rr3 = requests.post(self.srv.base + '/api/timeline', data=json.dumps(body2),
                            headers={'PAYMENT-SIGNATURE': base64.b64encode(json.dumps(sig2).encode()).decode(),
                                     'Content-Type': 'application/json'})
        check(rr3.status_code == 409 and rr3.json().get('code') == 'idempotency_conflict', 'x402-idem-conflict',
              'payment-identifier reuse for another request not 409 idempotency_conflict', st=rr3.status_code,
              j=rr3.text[:300])
        if rr3.status_code == 201:
            self.wallet.pop(sec2); self.spent.add(sec2); self.fees_paid += units('0.3')
            ch = rr3.json()['payment'].get('change')
            if ch: self.wallet[ch] = sec_amount(ch)
            self.add_plain_post(rr3.json()['post_id'], a.fp, c + ' other')
        else:
            self.verify_secret(sec2, False, 'x402-conflict')

    def swap_fees(self):
        data = open(PLUGINS + '/fees_pickup_paid.wasm', 'rb').read()
        r = requests.put(self.srv.admin + '/admin/plugins/fees', data=data,
                         headers={'Authorization': 'Bearer ' + self.srv.token()}, timeout=60)
        if not check(r.status_code == 200, 'fee-swap', 'fee plugin swap failed', st=r.status_code, j=r.text[:300]):
            return
        self.policy = 'pickup-paid'
        st, j, _ = self.api.req('GET', '/api/fees')
        check(j['arbitration']['policy'] == 'pickup-paid', 'fees-after-swap', '/api/fees policy after swap',
              j=j['arbitration'])
        print('-- fee policy swapped to pickup-paid', flush=True)
        for path in (['accept', 'deliver', 'pickup_b', 'pickup_s', 'pickup_b'],
                     ['accept', 'release', 'pickup_s', 'pickup_b', 'pickup_s'],
                     ['accept', 'release', 'pickup_b', 'pickup_s']):
            self.directed(path)

    def directed(self, path):
        n = len(self.contracts)
        self.op_buy()
        if len(self.contracts) == n:
            return
        c = list(self.contracts.values())[-1]
        for step in path:
            action, role = {'accept': ('accept', 'seller'), 'deliver': ('deliver', 'seller'),
                            'release': ('release', 'buyer'), 'pickup_b': ('pickup', 'buyer'),
                            'pickup_s': ('pickup', 'seller')}[step]
            self.force = (c, action, role)
            self.op_contract_step()
        self.force = None
        print('-- directed', path, c.status, c.policy, 'fee_paid', c.fee_paid, flush=True)

    def stop_under_load(self):
        import threading
        live = self.live_ids()
        stop = threading.Event()
        recs = []
        pre = {k: [self.mint_quiet(units('0.3')) for _ in range(60)] for k in range(6)}
        def worker(k):
            api = Api(self.srv)
            a = live[k % len(live)]
            n = 0
            while not stop.is_set() and n < 60:
                sec = pre[k][n]
                n += 1
                c = f'load {self.tokn_thread(k, n)} alpha'
                body = a.post_body(c)
                try:
                    st, j, _ = api.req('POST', '/api/timeline', body, secret=sec)
                except Exception as e:
                    st, j = None, str(e)[:100]
                recs.append((sec, c, a.fp, st, j))
                if st is None:
                    break
        ths = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
        for t in ths: t.start()
        time.sleep(0.4)
        self.srv.stop()
        stop.set()
        for t in ths: t.join()
        self.srv.start()
        counts = {}
        for sec, c, fp, st, j in recs:
            counts[st] = counts.get(st, 0) + 1
            tok = c.split()[1]
            js = self.search(tok)
            found = [r['post_id'] for r in js['results']] if js else []
            stc, jc, _ = self.api.req('POST', '/api/cash/health_check', [public_of(sec)])
            spent = jc['results'][public_of(sec)]['spent']
            if st == 201:
                check(found == [j['post_id']] and spent, 'load-201-lost', 'a 201 post is lost after SIGTERM',
                      st=st, found=found, spent=spent)
            else:
                check(bool(found) == bool(spent), 'load-atomic', 'after SIGTERM: post and spend disagree',
                      st=st, found=found, spent=spent, j=str(j)[:200])
            if spent:
                self.minted += units('0.3'); self.fees_paid += units('0.3')
                self.spent.add(sec)
                if found:
                    self.add_plain_post(found[0], fp, c)
            else:
                self.minted += units('0.3'); self.wallet[sec] = units('0.3')
        self.order.sort()
        print('-- stop under load: statuses', counts, flush=True)

    def tokn_thread(self, k, n):
        s = ''
        x = k * 1000 + n
        for _ in range(5):
            s += chr(ord('a') + x % 26); x //= 26
        return 'zqload' + s + str(self.seed % 10 and '') 

    def mint_quiet(self, amt):
        r = requests.post(self.srv.admin + '/admin/cash/mint', json={'amount': fmt(amt)},
                          headers={'Authorization': 'Bearer ' + self.srv.token()}, timeout=10)
        return r.json()['secret']

    def compare_contract(self, c):
        st, j, _ = self.api.req('GET', f'/api/arbitration/contracts/{c.cid}')
        if not check(st == 200, 'ctr-get', 'contract read failed', st=st, cid=c.cid):
            return
        got = (j.get('status'), j.get('buyer_fingerprint'), j.get('target_seller_fingerprint'),
               units(j.get('amount', '0')), j.get('reference_post'))
        want = (c.status, c.buyer, c.seller, c.amount, c.ref)
        check(got == want, 'ctr-doc', 'contract document differs from model', got=got, want=want)
        check(j.get('fee_policy') == c.policy, 'ctr-policy', 'contract fee_policy differs', got=j.get('fee_policy'),
              want=c.policy)
        check(j.get('amount') == fmt(c.amount), 'ctr-amount-fmt', 'amount not in shortest form', got=j.get('amount'))
        txt = json.dumps(j)
        check(':secret:' not in txt, 'ctr-secret', 'contract document shows a secret', cid=c.cid)
        hist = [h.get('action') for h in j.get('history', [])]
        trans = [h for h in hist if h != 'pickup' or True]
        # history: transitions (pickup counted only when first per party)
        core = [h for h in hist if h in ('buy', 'accept', 'deliver', 'release', 'refund')]
        want_core = [h for h in c.history if h in ('buy', 'accept', 'deliver', 'release', 'refund')]
        check(core == want_core, 'ctr-history', 'contract history transitions differ from model', got=hist,
              want=c.history)
        st, s, _ = self.api.req('GET', f'/api/arbitration/contracts/{c.cid}/status')
        if check(st == 200, 'ctr-status', 'status read failed', st=st):
            check(s.get('status') == c.status, 'ctr-status-val', 'status endpoint differs', got=s, want=c.status)
            aa = set(s.get('allowed_actions', []))
            want_aa = ALLOWED[c.status]
            check(aa == want_aa, f'ctr-allowed-{c.status}', 'allowed_actions differs from PROTOCOL 7 table',
                  got=sorted(aa), want=sorted(want_aa), status=c.status)

    def op_buyer_refund_after_deadline(self):
        """a contract with a deadline 3 s ahead; accept; wait; buyer refunds active (allowed after deadline)"""
        live = self.live_ids()
        refs = [p for p in self.alive_posts() if p.parent is None and not self.byfp[p.author].deleted]
        if not refs or len(live) < 2:
            return
        ref = self.rng.choice(refs)
        buyer = self.rng.choice([i for i in live if i.fp != ref.author])
        seller = self.byfp[ref.author]
        # A deadline 4 s away, to the second as it is written.
        dl_epoch = int(time.time()) + 4
        dl = time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(dl_epoch))
        body = {'buyer_fingerprint': buyer.fp, 'contract_type': 'service', 'amount': '0.25',
                'reference_post': ref.pid, 'delivery_deadline': dl, 'accept_terms': True,
                **buyer.fresh(f'buy_contract:{buyer.fp}:{ref.pid}::')}
        st, j, _ = self.paid('POST', '/api/arbitration/contracts/buy', body, units('0.25'))
        if not check(st == 201, 'buy-deadline', 'buy with a near deadline failed', st=st, j=str(j)[:300]):
            return
        self.fees_paid -= units('0.25'); self.escrow += units('0.25')
        c = Contract(j['contract_id'], buyer.fp, seller.fp, units('0.25'), ref.pid)
        c.policy = self.policy; c.fee_paid = False
        self.contracts[c.cid] = c
        st, j, _ = self.act(c, 'accept', seller)
        if st == 200:
            c.status = 'active'; c.history.append('accept')
        # (Asked only while the deadline is surely ahead: a machine slow
        # enough to pass it meanwhile says nothing of the service.)
        if time.time() < dl_epoch - 1:
            st, j, _ = self.act(c, 'refund', buyer)
            check(st == 403, 'refund-before-deadline', 'buyer refund of active before deadline not 403', st=st,
                  j=j)
        time.sleep(max(0.0, dl_epoch + 1.5 - time.time()))
        st, j, _ = self.act(c, 'refund', buyer)
        if check(st == 200, 'refund-after-deadline', 'buyer refund of active after deadline not 200', st=st, j=j):
            c.status = 'refunded'; c.history.append('refund')
        st, s, _ = self.api.req('GET', f'/api/arbitration/contracts/{c.cid}/status')
        self.compare_contract(c)

    # ------------------------------------------------------------ reads
    def expected_post_fields(self, p):
        kids = [q for q in self.posts.values() if q.parent == p.pid and not q.deleted]
        return kids

    def compare_post(self, p, got, ctx):
        if got is None:
            finding('DEFECT', 'post-missing-' + ctx, 'post body missing', pid=p.pid)
            return
        want = {'post_id': p.pid, 'author_fingerprint': p.author, 'content': p.content, 'post_type': p.ptype,
                'parent_id': p.parent, 'keywords': p.keywords}
        for k, v in want.items():
            check(got.get(k) == v, f'post-field-{k}-{ctx}', f'post field {k} differs from model ({ctx})',
                  pid=p.pid, got=got.get(k), want=v)
        names = [a.get('filename') for a in got.get('attachments', [])]
        check(names == [a['filename'] for a in p.atts], f'post-atts-{ctx}', 'attachment list differs',
              got=names, want=[a['filename'] for a in p.atts])
        for a, g in zip(p.atts, got.get('attachments', [])):
            b = a['content'].encode()
            check(g.get('size') == len(b) and g.get('sha256') == hashlib.sha256(b).hexdigest(),
                  'att-meta', 'attachment size/sha256 differ', got=g, want=len(b))
        lower = [a['filename'].lower() for a in p.atts]
        terms = 'terms.md' in lower
        desc = next((d for d in ['service.md', 'product.md', 'skill.md', 'description.md'] if d in lower), None)
        lst = got.get('listing', {})
        check(lst == {'terms': terms, 'descriptor': desc, 'verified': terms and desc is not None}, 'listing',
              'listing verification differs', got=lst, names=lower)
        a = self.byfp.get(p.author)
        want_nick = a.nick if a and not a.deleted else None
        if not (a and a.deleted):
            check(got.get('author_nick') == want_nick, 'author-nick', 'author_nick differs', got=got.get('author_nick'),
                  want=want_nick)
        if ctx != 'create':
            kids = [q for q in self.posts.values() if q.parent == p.pid and not q.deleted]
            kids_np = [q for q in kids if not q.private]
            cc = got.get('comment_count')
            if cc == len(kids_np) and len(kids) != len(kids_np):
                finding('NOTE', 'cc-private', 'comment_count excludes private replies', pid=p.pid)
            elif cc == len(kids) and len(kids) != len(kids_np):
                finding('NOTE', 'cc-private-in', 'comment_count includes private replies', pid=p.pid)
            else:
                check(cc == len(kids), 'comment-count', 'comment_count differs from live direct replies',
                      pid=p.pid, got=cc, want=len(kids), with_deleted=len([q for q in self.posts.values()
                                                                          if q.parent == p.pid]))
            up = sum(v == 'up' for v in p.votes.values()); dn = sum(v == 'down' for v in p.votes.values())
            check(got.get('rating') == {'up': up, 'down': dn}, 'post-rating', 'post rating differs',
                  got=got.get('rating'), want=(up, dn), pid=p.pid)

    def check_posts(self):
        for pid in self.order:
            p = self.posts[pid]
            st, j, _ = self.api.req('GET', f'/api/posts/{pid}')
            if p.deleted:
                check(st == 404 and isinstance(j, dict) and j.get('code') == 'not_found', 'deleted-post-read',
                      'deleted post still readable', pid=pid, st=st)
                st, j, _ = self.api.req('GET', f'/api/posts/{pid}/attachments/0')
                check(st == 404, 'deleted-att', 'attachment of deleted post still readable', st=st)
                continue
            if not check(st == 200, 'post-read', 'post read failed', pid=pid, st=st, j=str(j)[:200]):
                continue
            self.compare_post(p, j.get('post'), 'read')
            if p.private:
                check(j['post'].get('encrypted_payload') == p.payload, 'priv-payload', 'private payload differs')
            for i, a in enumerate(p.atts):
                st, body, r = self.api.req('GET', f'/api/posts/{pid}/attachments/{i}')
                check(st == 200 and body == a['content'].encode() if isinstance(body, bytes) else
                      (st == 200 and r.content == a['content'].encode()), 'att-read', 'attachment bytes differ',
                      pid=pid, i=i, st=st)
            st, j, _ = self.api.req('GET', f'/api/posts/{pid}/attachments/{len(p.atts)}')
            check(st == 404, 'att-past-end', 'attachment index past end not 404', st=st)

    def descendants(self, pid):
        out = []
        stack = [pid]
        while stack:
            x = stack.pop()
            for q in self.posts.values():
                if q.parent == x:
                    stack.append(q.pid)
                    if not q.deleted:
                        out.append(q)
        return sorted(out, key=lambda q: q.pid)

    def check_threads(self):
        for pid in self.order:
            p = self.posts[pid]
            st, j, _ = self.api.req('GET', f'/api/thread/{pid}')
            if p.deleted:
                check(st == 404, 'thread-deleted', 'thread of deleted post not 404', st=st)
                continue
            if not check(st == 200, 'thread', 'thread read failed', st=st, pid=pid):
                continue
            want = [q.pid for q in self.descendants(pid)]
            got = [q['post_id'] for q in j['comments']]
            nxt = j.get('next_after')
            guard = 0
            while nxt and guard < 50:
                guard += 1
                st, j2, _ = self.api.req('GET', f'/api/thread/{pid}', params={'after': nxt})
                got += [q['post_id'] for q in j2['comments']]
                nxt = j2.get('next_after')
            check(j['root']['post_id'] == pid, 'thread-root', 'thread root differs')
            if got != want and set(got) == set(want):
                finding('DEFECT', 'thread-order', 'thread comments not oldest first', got=got, want=want)
            else:
                check(got == want, 'thread-comments', 'thread descendants differ from model', pid=pid,
                      missing=[x for x in want if x not in got], extra=[x for x in got if x not in want])
            check(j['count'] == len(want), 'thread-count', 'thread count differs', got=j['count'], want=len(want),
                  pid=pid)

    def timeline_expected(self, ptype=None, author=None):
        out = [p for p in self.alive_posts() if (ptype is None or p.ptype == ptype) and
               (author is None or p.author == author)]
        return [p.pid for p in sorted(out, key=lambda p: p.pid, reverse=True)]

    def page_timeline(self, ptype=None, author=None, limit=None, interleave=False):
        params = {}
        if ptype: params['post_type'] = ptype
        if author: params['author'] = author if self.rng.random() < 0.7 else author.upper()
        if limit: params['limit'] = limit
        want = self.timeline_expected(ptype, author)
        got, before, pages = [], None, 0
        inserted = []
        while pages < 3000:
            q = dict(params)
            if before: q['before'] = before
            st, j, _ = self.api.req('GET', '/api/timeline', params=q)
            if not check(st == 200, 'timeline', 'timeline read failed', st=st, j=j, q=q):
                return
            ids = [x['post_id'] for x in j['posts']]
            check(len(ids) <= (limit or 20), 'timeline-limit', 'page longer than limit', n=len(ids), limit=limit)
            got += ids
            pages += 1
            before = j.get('next_before')
            if before:
                # The last id of the page, or (a page that passed over 256
                # posts it does not list: README) a cursor below it.
                check(not ids or before <= ids[-1], 'next-before', 'next_before is above the last id of the page',
                      nb=before, last=ids[-1] if ids else None)
            if interleave and pages == 1 and before:
                # a write between pages: new post must not shift the next page
                p = self.op_post()
                if p: inserted.append(p.pid)
            if not before:
                break
        check(len(got) == len(set(got)), 'timeline-dups', 'timeline paging returned duplicates', q=params)
        check(got == want, 'timeline-content', 'timeline (paged) differs from model', q=params, limit=limit,
              missing=[x for x in want if x not in got][:5], extra=[x for x in got if x not in want][:5],
              order_ok=sorted(got, reverse=True) == got)
        if not before and got:
            # past the end: nothing more (a page that passed over 256
            # unlisted posts may still give a cursor, to more empty pages)
            cursor = got[-1]
            for _ in range(100):
                st, j, _ = self.api.req('GET', '/api/timeline', params=dict(params, before=cursor))
                ok = check(st == 200 and j['posts'] == [], 'timeline-past-end',
                           'paging past the end not empty', j=str(j)[:200])
                cursor = j.get('next_before') if ok else None
                if not cursor:
                    break
        return inserted

    def check_timeline(self):
        self.page_timeline()
        self.page_timeline(limit=self.rng.choice([1, 3, 7]))
        self.page_timeline(ptype=self.rng.choice(TYPES + ['comment']), limit=self.rng.choice([2, 5, 100]))
        if self.live_ids():
            self.page_timeline(author=self.rng.choice(self.ids).fp, limit=self.rng.choice([1, 4]))

    def indexed_tokens(self, p):
        t = tokens_of(p.content)
        for k in p.keywords:
            t |= tokens_of(k)
        for a in p.atts:
            if a['filename'].lower().endswith('.md') or (a.get('attachment_type') or '').startswith('text/markdown'):
                t |= tokens_of(a['content'])
        return t

    def plain_tokens(self, p):
        t = set()
        for a in p.atts:
            if not a['filename'].lower().endswith('.md'):
                t |= tokens_of(a['content'])
        return t

    def search(self, term, limit=100, ptype=None, via_mcp=False):
        if via_mcp:
            b = {'term': term, 'limit': limit}
            if ptype: b['post_type'] = ptype
            st, j, _ = self.api.req('POST', '/api/mcp/tools/search', b)
        else:
            q = {'term': term, 'limit': limit}
            if ptype: q['post_type'] = ptype
            st, j, _ = self.api.req('GET', '/api/search', params=q)
        check(st == 200, 'search', 'search failed', st=st, term=term, j=str(j)[:200])
        return j if st == 200 else None

    def check_search(self, full=False):
        alive = self.alive_posts()
        sample = alive if full else self.rng.sample(alive, min(8, len(alive)))
        for p in sample:
            toks = [t for t in self.indexed_tokens(p) if t.startswith('zq')]
            for t in toks:
                term = t.upper() if self.rng.random() < 0.3 else t
                j = self.search(term, via_mcp=self.rng.random() < 0.2)
                if not j: continue
                ids = [r['post_id'] for r in j['results']]
                owners = [q.pid for q in alive if t in self.indexed_tokens(q)]
                check(sorted(ids) == sorted(owners) and j['total'] == len(owners), 'search-unique',
                      'search for a unique word differs from model', term=term, got=ids, want=owners, pid=p.pid)
            for t in self.plain_tokens(p):
                if t.startswith('zq'):
                    j = self.search(t)
                    if j and j['total']:
                        finding('NOTE', 'search-plain-att', 'a text/plain attachment is indexed', term=t)
        dead = [p for p in self.posts.values() if p.deleted and not p.private]
        for p in (dead if full else self.rng.sample(dead, min(5, len(dead)))):
            for t in [t for t in self.indexed_tokens(p) if t.startswith('zq')]:
                j = self.search(t)
                if j:
                    check(j['total'] == 0 and j['results'] == [], 'search-deleted', 'deleted post still found',
                          term=t, pid=p.pid, got=[r['post_id'] for r in j['results']])
        for p in self.posts.values():
            for t in list(p.dead_tokens)[:3] if not full else p.dead_tokens:
                owners = [q.pid for q in alive if t in self.indexed_tokens(q)]
                j = self.search(t)
                if j:
                    check([r['post_id'] for r in j['results']] == owners, 'search-updated-away',
                          'text updated away still found', term=t, pid=p.pid, got=j['results'][:1])
        for p in self.posts.values():
            if p.private and p.payload:
                j = self.search(p.payload.split()[0][3:])
                if j:
                    check(j['total'] == 0, 'search-private', 'private reply payload found by search')
        # shared words with filters
        for w in WORDS if full else [self.rng.choice(WORDS)]:
            for ptype in [None, self.rng.choice(TYPES)]:
                owners = [q for q in alive if w in self.indexed_tokens(q) and (ptype is None or q.ptype == ptype)]
                lim = self.rng.choice([100, 5])
                j = self.search(w, limit=lim, ptype=ptype)
                if not j: continue
                ids = [r['post_id'] for r in j['results']]
                check(len(ids) == len(set(ids)), 'search-dups', 'duplicate search results', term=w)
                check(j['total'] == len(owners), 'search-total', 'search total differs from model', term=w,
                      ptype=ptype, got=j['total'], want=len(owners))
                if lim >= len(owners):
                    check(sorted(ids) == sorted(q.pid for q in owners), 'search-set', 'search result set differs',
                          term=w, ptype=ptype, missing=[q.pid for q in owners if q.pid not in ids][:5],
                          extra=[x for x in ids if x not in [q.pid for q in owners]][:5])
                else:
                    check(len(ids) == lim, 'search-limit', 'search did not fill the limit', got=len(ids), lim=lim)
                sc = [r['score'] for r in j['results']]
                check(sc == sorted(sc, reverse=True), 'search-rank', 'results not in score order', sc=sc)
                for a, b in zip(j['results'], j['results'][1:]):
                    if a['score'] == b['score']:
                        check(a['post_id'] > b['post_id'], 'search-tie', 'equal scores not newest first',
                              a=a['post_id'], b=b['post_id'])
                for r in j['results']:
                    q = self.posts.get(r['post_id'])
                    if q: self.compare_post(q, r, 'search')

    def check_profiles(self):
        for i in self.ids:
            st, j, _ = self.api.req('GET', '/api/profile', params={'fingerprint': i.fp})
            if i.deleted:
                check(st == 404, 'profile-deleted', 'deleted identity profile not 404', st=st)
                continue
            if not check(st == 200, 'profile', 'profile read failed', st=st, fp=i.fp):
                continue
            pr = j['profile']
            up, down = self.author_rating(i.fp)
            check(pr.get('rating') == {'up': up, 'down': down, 'score': up - down}, 'profile-rating',
                  'profile rating aggregate differs from model', got=pr.get('rating'), want=(up, down), nick=i.nick)
            mine = [p for p in self.posts.values() if p.author == i.fp]
            cands = {
                'all': len(mine),
                'alive': len([p for p in mine if not p.deleted]),
                'alive_public': len([p for p in mine if not p.deleted and not p.private]),
                'alive_top': len([p for p in mine if not p.deleted and p.parent is None]),
                'top_all': len([p for p in mine if p.parent is None]),
            }
            pc = pr.get('post_count')
            matches = [k for k, v in cands.items() if v == pc]
            if not matches:
                finding('DEFECT', 'post-count', 'profile post_count matches no reasonable count of the model',
                        got=pc, model=cands, nick=i.nick)
            else:
                self.pc_sem = getattr(self, 'pc_sem', set(cands)) & set(matches)
                if not self.pc_sem:
                    finding('DEFECT', 'post-count-inconsistent',
                            'profile post_count follows no single rule across profiles', got=pc, model=cands)
            check(pr.get('nickname') == i.nick and pr.get('about') == i.about, 'profile-fields',
                  'profile nickname/about differs', got=(pr.get('nickname'), pr.get('about')), want=(i.nick, i.about))
            st2, j2, _ = self.api.req('GET', '/api/profile', params={'nickname': i.nick.upper()})
            check(st2 == 200 and j2['profile']['fingerprint'] == i.fp, 'profile-nick',
                  'profile by nickname (case-insensitive) differs', st=st2, nick=i.nick)

    def full_check(self, tag):
        print(f'-- full check ({tag}) posts={len(self.posts)} ids={len(self.ids)} ctr={len(self.contracts)}',
              flush=True)
        self.check_posts()
        self.check_threads()
        self.check_timeline()
        self.check_search(full=True)
        self.check_profiles()
        for c in self.contracts.values():
            self.compare_contract(c)
        self.check_wallet()

    # ------------------------------------------------------------ edge cases
    def edge_cases(self):
        a = self.live_ids()[0]
        # max length content in multibyte chars
        big = 'é' * 65536
        r = self.op_post(content=big, ptype='general', atts=[], keywords=[self.tok()])
        if r is None:
            finding('DEFECT', 'maxlen', '65536-char content rejected', n=len(big))
        else:
            # Its keyword finds it, however long its content (PROTOCOL 5).
            term = r.keywords[0]
            j = self.search(term)
            check(j and [x['post_id'] for x in j['results']] == [r.pid], 'maxlen-keyword',
                  'the keyword of a post of the longest content does not find it', term=term,
                  got=j and j['total'])
        st, j = self.op_post(content='é' * 65537, ptype='general', atts=[], expect_ok=False)
        check(st == 400 and j.get('code') == 'invalid_request', 'maxlen+1', '65537-char content not 400', st=st)
        # NFC / NFD search
        t = self.tok()
        p = self.op_post(content=f'{t} caf\u00e9{t[2:6]} unicode', ptype='general', atts=[])
        if p:
            j = self.search(f'cafe\u0301{t[2:6]}')
            check(j and [r['post_id'] for r in j['results']] == [p.pid], 'nfc-search',
                  'NFD query does not find NFC text', got=j and j['total'])
            j = self.search(f'CAF\u00c9{t[2:6]}')
            check(j and [r['post_id'] for r in j['results']] == [p.pid], 'case-search-unicode',
                  'upper-case unicode query does not find the post', got=j and j['total'])
        # limits
        for lim in ['0', '101', 'x', '-1', '1.0']:
            st, j, _ = self.api.req('GET', '/api/timeline', params={'limit': lim})
            check(st == 400 and j.get('code') == 'invalid_request', 'tl-limit-' + lim, 'bad limit not 400', lim=lim,
                  st=st)
            st, j, _ = self.api.req('GET', '/api/search', params={'term': 'alpha', 'limit': lim})
            check(st == 400, 'search-limit-' + lim, 'bad search limit not 400', lim=lim, st=st)
        st, j, _ = self.api.req('GET', '/api/search')
        check(st == 400, 'search-noterm', 'search without term not 400', st=st)
        j = self.search('zzznothingmatchesthis')
        check(j and j['total'] == 0 and j['results'] == [], 'search-empty', 'empty search not empty')
        st, j, _ = self.api.req('GET', '/api/posts/post_01AAAAAAAAAAAAAAAAAAAAAAAA')
        check(st == 404 and j.get('code') == 'not_found', 'unknown-post', 'unknown post not 404 not_found', st=st)
        st, j, _ = self.api.req('GET', '/api/arbitration/contracts/CTR_nope')
        check(st == 404, 'unknown-ctr', 'unknown contract not 404', st=st)
        st, j, _ = self.api.req('GET', '/api/timeline', params={'before': 'post_0'})
        check(st == 200 and j['posts'] == [], 'tl-before-min', 'before below every id not empty', st=st)
        # v1 alias
        st, j, _ = self.api.req('GET', '/api/v1/timeline', params={'limit': 3})
        st2, j2, _ = self.api.req('GET', '/api/timeline', params={'limit': 3})
        check(st == st2 == 200 and j == j2, 'v1-alias', '/api/v1 alias answers differently')
        # spent secret reused for a different body -> 402 payment_spent
        if self.spent:
            s = sorted(self.spent)[0]
            body = {'author_fingerprint': a.fp, 'content': 'spent ' + self.tok(), **a.fresh('post:x')}
            st, j, _ = self.api.req('POST', '/api/timeline', body, secret=s)
            check(st == 402 and j.get('code') == 'payment_spent', 'spent-reuse', 'reused spent secret not 402 spent',
                  st=st, j=j)
        # fresh signature reuse on a new paid request: 409 conflict, nothing spent
        c = 'sigreuse ' + self.tok()
        sig = a.fresh(f'post:{c}')
        body = {'author_fingerprint': a.fp, 'content': c, **sig}
        st, j, _ = self.paid('POST', '/api/timeline', body, units('0.3'))
        if st == 201:
            pid = j['post_id']
            self.add_plain_post(pid, a.fp, c)
            body2 = dict(body, keywords=['different'])
            sec = self.pick(units('0.3'))
            st, j, _ = self.api.req('POST', '/api/timeline', body2, secret=sec)
            check(st == 409 and j.get('code') == 'conflict', 'fresh-sig-reuse', 'fresh signature reuse not 409',
                  st=st, j=j)
            if st != 201:
                self.verify_secret(sec, False, 'sig-reuse')
        # insufficient payment
        sec = self.mint(units('0.2'))
        body = {'author_fingerprint': a.fp, 'content': 'cheap ' + self.tok()}
        body.update(a.fresh('post:' + body['content']))
        st, j, _ = self.api.req('POST', '/api/timeline', body, secret=sec)
        check(st == 402 and j.get('code') == 'payment_insufficient', 'insufficient', 'underpayment not 402 insufficient',
              st=st, j=j)
        self.verify_secret(sec, False, 'insufficient')
        # comment on unknown parent -> 404, nothing spent
        sec = self.pick(units('0.01'))
        body = {'author_fingerprint': a.fp, 'content': 'orphan ' + self.tok(), 'parent_id': 'post_01ZZZZZZZZZZZZZZZZZZZZZZZZ'}
        body.update(a.fresh('post:' + body['content']))
        st, j, _ = self.api.req('POST', '/api/timeline', body, secret=sec)
        check(st == 404, 'orphan', 'comment on unknown parent not 404', st=st, j=j)
        self.verify_secret(sec, False, 'orphan')
        # seller release with tracking (PROTOCOL 10), on an active contract
        # duplicate attachment names
        st, j = self.op_post(atts=[{'filename': 'a.md', 'content': 'x'}, {'filename': 'A.md', 'content': 'y'}],
                             ptype='general', content='dupatt ' + self.tok(), expect_ok=False)
        check(st == 400 and j.get('code') == 'invalid_attachment', 'dup-att', 'duplicate attachment names not 400',
              st=st, j=j)

    # ------------------------------------------------------------ main loop
    def run(self):
        self.srv.start()
        t0 = time.time()
        try:
            for _ in range(4):
                self.op_register()
            ops = [(self.op_register, 3), (self.op_register_dup, 1), (self.op_post, 14),
                   (lambda: self.op_post(parent=self.rng.choice(self.alive_posts(True) or [None]))
                    if self.alive_posts() else None, 10),
                   (self.op_private_reply, 2), (self.op_update, 6), (self.op_delete, 4), (self.op_rate, 6),
                   (self.op_rate_deleted, 1), (self.op_profile_update, 2), (self.op_buy, 7),
                   (self.op_legacy_pickup, 2), (self.op_delete_identity, 1), (self.op_double_spend, 1),
                   (self.op_mcp_execute, 1), (self.op_x402, 1),
                   (self.op_contract_step, 30),
                   (lambda: self.page_timeline(limit=self.rng.choice([2, 3]), interleave=True), 2),
                   (lambda: self.check_search(), 3)]
            fns, weights = zip(*ops)
            restart_at = self.steps // 2
            for step in range(self.steps):
                self.step = step
                if time.time() - t0 > 900:
                    print('time budget reached'); break
                f = self.rng.choices(fns, weights)[0]
                f()
                if step == (2 * self.steps) // 3:
                    self.swap_fees()
                if step == self.steps // 3:
                    self.edge_cases()
                    self.op_buyer_refund_after_deadline()
                if step % 25 == 24:
                    self.full_check(f'step {step}')
                if step == restart_at:
                    self.full_check('before restart')
                    before = self.snapshot()
                    self.srv.stop()
                    self.srv.start()
                    after = self.snapshot()
                    check(before == after, 'restart-snapshot', 'reads differ across restart',
                          diff=[k for k in before if before[k] != after.get(k)][:5])
                    self.stop_under_load()
                    before = after = None
                    self.full_check('after restart')
            # finish contracts to drain escrow, then final check
            self.full_check('final')
        finally:
            self.srv.stop()
        print(f'done seed={self.seed} steps={self.step + 1} posts={len(self.posts)} contracts={len(self.contracts)} '
              f'requests={len(self.api.log)} findings={len(FINDINGS)}')
        from collections import Counter
        for k, v in sorted(Counter(self.api.log).items()):
            if k[0] == 'POST': print('  cov', k, v)

    def snapshot(self):
        snap = {}
        st, j, _ = self.api.req('GET', '/api/timeline', params={'limit': 100})
        snap['timeline'] = j
        for pid in self.order[-20:]:
            snap[pid] = self.api.req('GET', f'/api/posts/{pid}')[1]
        for cid in list(self.contracts)[:20]:
            snap[cid] = self.api.req('GET', f'/api/arbitration/contracts/{cid}')[1]
        for i in self.ids:
            snap[i.fp] = self.api.req('GET', '/api/profile', params={'fingerprint': i.fp})[1]
        snap['search'] = self.api.req('GET', '/api/search', params={'term': 'alpha bravo', 'limit': 50})[1]
        return snap


if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('--seed', type=int, action='append')
    ap.add_argument('--steps', type=int, default=300)
    a = ap.parse_args()
    for seed in a.seed or [1]:
        with tempfile.TemporaryDirectory() as work:
            try:
                Probe(seed, a.steps, work).run()
            except Exception:
                # The host's log tells what it saw.
                log = os.path.join(work, f'data-{seed}.log')
                if os.path.exists(log):
                    sys.stderr.write(open(log, errors='replace').read()[-20000:])
                raise
    defects = [f for f in FINDINGS if f['kind'] == 'DEFECT']
    print(f'model check: {len(defects)} defects, '
          f'{len(FINDINGS) - len(defects)} notes, seeds {a.seed or [1]}')
    sys.exit(1 if defects else 0)
