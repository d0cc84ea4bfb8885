"""numba half of partition/multilevel.py: the blocks each net touches, kept as a short list per net
(block, pins there) in slots beside the net's pins, so memory is linear in the pins whatever P;
a forward placement sweep; label propagation with exact gains and pair swaps under a per-layer
balance limit. Every move is applied at once and every gain is computed from the current
lists, so the objective (connectivity - 1, weighted) never increases."""

from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit(cache=True, nogil=True)
def _add(e, b, net_indptr, nblk, blk, cnt):
    s = net_indptr[e]
    m = nblk[e]
    for t in range(m):
        if blk[s + t] == b:
            cnt[s + t] += 1
            return
    blk[s + m] = b
    cnt[s + m] = 1
    nblk[e] = m + 1


@nb.njit(cache=True, nogil=True)
def build_lists(net_indptr, net_pins, parts, nblk, blk, cnt):
    """Each net's distinct blocks and pin counts (pins in block -1, unplaced, are skipped).
    ``_add`` written out, the list's length kept in a register (calls to ``_add`` reload and
    store it at every pin)."""
    for e in range(len(net_indptr) - 1):
        s = net_indptr[e]
        m = 0
        for i in range(net_indptr[e], net_indptr[e + 1]):
            b = parts[net_pins[i]]
            if b < 0:
                continue
            t = 0
            while t < m and blk[s + t] != b:
                t += 1
            if t < m:
                cnt[s + t] += 1
            else:
                blk[s + m] = b
                cnt[s + m] = 1
                m += 1
        nblk[e] = m


@nb.njit(cache=True, nogil=True)
def _remove(e, b, net_indptr, nblk, blk, cnt):
    s = net_indptr[e]
    m = nblk[e]
    for t in range(m):
        if blk[s + t] == b:
            cnt[s + t] -= 1
            if cnt[s + t] == 0:  # the last entry takes its slot
                blk[s + t] = blk[s + m - 1]
                cnt[s + t] = cnt[s + m - 1]
                nblk[e] = m - 1
            return


@nb.njit(cache=True, nogil=True)
def _move(v, a, b, layer, parts, weights, loads, vptr, vnets, net_indptr, nblk, blk, cnt):
    for i in range(vptr[v], vptr[v + 1]):
        e = vnets[i]
        if a >= 0:
            _remove(e, a, net_indptr, nblk, blk, cnt)
        _add(e, b, net_indptr, nblk, blk, cnt)
    if a >= 0:
        loads[layer, a] -= weights[v]
    loads[layer, b] += weights[v]
    parts[v] = b


@nb.njit(cache=True, nogil=True)
def _connections(v, own, vptr, vnets, net_w, net_indptr, nblk, blk, cnt, conn, stamp, touched):
    """conn[b] = weight of v's nets that touch block b != own (for b in touched[:n]);
    returns (n, removed, total): the weight of nets where v is own's only pin, and of all."""
    n = 0
    removed = 0
    total = 0
    for i in range(vptr[v], vptr[v + 1]):
        e = vnets[i]
        w = net_w[e]
        total += w
        s = net_indptr[e]
        for t in range(nblk[e]):
            b = blk[s + t]
            if b == own:
                if cnt[s + t] == 1:
                    removed += w
            else:
                if stamp[b] != v:
                    stamp[b] = v
                    conn[b] = 0
                    touched[n] = b
                    n += 1
                conn[b] += w
    return n, removed, total


@nb.njit(cache=True, nogil=True)
def gain(v, b, parts, vptr, vnets, net_w, net_indptr, nblk, blk, cnt):
    """The exact decrease of the objective if v moved to block b."""
    own = parts[v]
    g = 0
    for i in range(vptr[v], vptr[v + 1]):
        e = vnets[i]
        s = net_indptr[e]
        here = 0
        there = 0
        for t in range(nblk[e]):
            if blk[s + t] == own:
                here = cnt[s + t]
            elif blk[s + t] == b:
                there = 1
        if here == 1:
            g += net_w[e]
        if there == 0:
            g -= net_w[e]
    return g


@nb.njit(cache=True, nogil=True)
def place_layer(lo, hi, layer, order, parts, weights, loads, limit, nparts, vptr, vnets,
                net_w, net_indptr, nblk, blk, cnt, conn, stamp, touched):
    """Place the unplaced vertices lo..hi-1 in ``order``, each on the block its placed nets
    touch most (the lightest such block on a tie) among those with room; a vertex whose nets
    touch no block with room goes to the lightest block (FREIGHT's streaming rule with a hard
    limit)."""
    for q in range(len(order)):
        v = lo + order[q]
        n, _, _ = _connections(v, -1, vptr, vnets, net_w, net_indptr, nblk, blk, cnt, conn,
                               stamp, touched)
        best = -1
        for t in range(n):
            b = touched[t]
            if loads[layer, b] + weights[v] > limit:
                continue
            if best < 0 or conn[b] > conn[best] or \
                    (conn[b] == conn[best] and loads[layer, b] < loads[layer, best]):
                best = b
        if best < 0:
            for b in range(nparts):
                if best < 0 or loads[layer, b] < loads[layer, best]:
                    best = b
        for t in range(n):
            stamp[touched[t]] = -1
        _move(v, -1, best, layer, parts, weights, loads, vptr, vnets, net_indptr, nblk, blk,
              cnt)


@nb.njit(cache=True, nogil=True)
def follow_users(lo, hi, parts, vptr, vnets, net_indptr, nblk, blk, cnt, nparts):
    """Vertices lo..hi-1 that carry no work (the input layer) join the block holding most of
    their net's pins: with no balance limit, any block of the net is optimal for the vertex."""
    for v in range(lo, hi):
        best = -1
        bestc = -1
        for i in range(vptr[v], vptr[v + 1]):
            e = vnets[i]
            s = net_indptr[e]
            for t in range(nblk[e]):
                if cnt[s + t] > bestc:
                    bestc = cnt[s + t]
                    best = blk[s + t]
        if best < 0:
            best = v % nparts
        parts[v] = best
        for i in range(vptr[v], vptr[v + 1]):
            _add(vnets[i], best, net_indptr, nblk, blk, cnt)


@nb.njit(cache=True, nogil=True)
def lp_layer(lo, hi, layer, order, parts, weights, loads, limit, vptr, vnets, net_w,
             net_indptr, nblk, blk, cnt, conn, stamp, touched, want_v, want_b, want_g):
    """One label-propagation round over the vertices lo..hi-1 of one layer: each moves to
    the block of best positive gain that has room (zero gain: to a lighter block). Vertices
    whose best move is blocked by the limit, or whose best gain is not positive, are listed
    (want_*) for pair swaps. Returns (gain, moves, listed)."""
    total = 0
    moves = 0
    listed = 0
    for q in range(len(order)):
        v = lo + order[q]
        own = parts[v]
        n, removed, wsum = _connections(v, own, vptr, vnets, net_w, net_indptr, nblk, blk, cnt,
                                        conn, stamp, touched)
        best = -1
        bestg = 0
        wish = -1
        wishg = -(1 << 62)
        for t in range(n):
            b = touched[t]
            g = removed - wsum + conn[b]
            if g > wishg or (g == wishg and loads[layer, b] < loads[layer, wish]):
                wish = b
                wishg = g
            if loads[layer, b] + weights[v] > limit:
                continue
            if g > bestg or (g == bestg and best >= 0 and loads[layer, b] < loads[layer, best]) \
                    or (g == 0 and best < 0 and loads[layer, b] + weights[v] < loads[layer, own]):
                best = b
                bestg = g
        for t in range(n):
            stamp[touched[t]] = -1
        if best >= 0 and (bestg > 0 or loads[layer, best] + weights[v] < loads[layer, own]):
            _move(v, own, best, layer, parts, weights, loads, vptr, vnets, net_indptr, nblk, blk,
                  cnt)
            total += bestg
            moves += 1
        elif wish >= 0:
            want_v[listed] = v
            want_b[listed] = wish
            want_g[listed] = wishg
            listed += 1
    return total, moves, listed


@nb.njit(cache=True, nogil=True)
def swap_pairs(layer, want_v, want_b, want_g, listed, parts, weights, loads, limit, nparts,
               vptr, vnets, net_w, net_indptr, nblk, blk, cnt):
    """Pair vertices that want a -> b with vertices that want b -> a, best gains first; a
    swap is applied when its exact gain (the second move's gain computed after the first)
    is positive and both blocks stay within the limit. Returns the gain."""
    if listed < 2:
        return 0
    key = np.empty(listed, dtype=np.int64)
    for i in range(listed):
        a = parts[want_v[i]]
        key[i] = a * nparts + want_b[i]
    # Sorted by (from, to), then by gain, best first.
    by_gain = np.argsort(-want_g[:listed], kind="mergesort")
    order = by_gain[np.argsort(key[by_gain], kind="mergesort")]
    ks = key[order]
    total = 0
    i0 = 0
    while i0 < listed:
        i1 = i0
        while i1 < listed and ks[i1] == ks[i0]:
            i1 += 1
        a, b = ks[i0] // nparts, ks[i0] % nparts
        if a < b:
            j0 = np.searchsorted(ks, b * nparts + a)
            j1 = np.searchsorted(ks, b * nparts + a + 1)
            i, j = i0, j0
            while i < i1 and j < j1:
                v = want_v[order[i]]
                u = want_v[order[j]]
                if want_g[order[i]] + want_g[order[j]] <= 0:
                    break
                if parts[v] != a or parts[u] != b:  # moved by an earlier swap
                    if parts[v] != a:
                        i += 1
                    if parts[u] != b:
                        j += 1
                    continue
                if loads[layer, a] - weights[v] + weights[u] > limit or \
                        loads[layer, b] - weights[u] + weights[v] > limit:
                    i += 1
                    j += 1
                    continue
                gv = gain(v, b, parts, vptr, vnets, net_w, net_indptr, nblk, blk, cnt)
                _move(v, a, b, layer, parts, weights, loads, vptr, vnets, net_indptr, nblk,
                      blk, cnt)
                gu = gain(u, a, parts, vptr, vnets, net_w, net_indptr, nblk, blk, cnt)
                if gv + gu > 0:
                    _move(u, b, a, layer, parts, weights, loads, vptr, vnets, net_indptr,
                          nblk, blk, cnt)
                    total += gv + gu
                else:
                    _move(v, b, a, layer, parts, weights, loads, vptr, vnets, net_indptr,
                          nblk, blk, cnt)
                i += 1
                j += 1
        i0 = i1
    return total


@nb.njit(cache=True, nogil=True)
def objective(net_w, nblk):
    total = 0
    for e in range(len(nblk)):
        if nblk[e] > 1:
            total += net_w[e] * (nblk[e] - 1)
    return total


@nb.njit(cache=True, nogil=True)
def match_layer(lo, hi, order, cluster, weights, max_weight, vptr, vnets, net_w, net_indptr,
                net_pins, max_net, rating, stamp, touched):
    """Heavy-edge matching of the vertices lo..hi-1 among themselves: each unmatched vertex, in
    ``order``, joins the unmatched vertex of the same layer that shares the most net weight
    with it (each net's share w / (pins - 1), nets above ``max_net`` pins ignored), if their
    weights together stay within ``max_weight``. cluster[v] is set to the pair's smaller id."""
    for q in range(len(order)):
        v = lo + order[q]
        if cluster[v] >= 0:
            continue
        n = 0
        for i in range(vptr[v], vptr[v + 1]):
            e = vnets[i]
            size = net_indptr[e + 1] - net_indptr[e]
            if size > max_net or size < 2:
                continue
            share = net_w[e] / (size - 1)
            for t in range(net_indptr[e], net_indptr[e + 1]):
                u = net_pins[t]
                if u == v or u < lo or u >= hi or cluster[u] >= 0:
                    continue
                if weights[u] + weights[v] > max_weight:
                    continue
                j = u - lo
                if stamp[j] != v:
                    stamp[j] = v
                    rating[j] = 0.0
                    touched[n] = j
                    n += 1
                rating[j] += share
        best = -1
        for t in range(n):
            j = touched[t]
            if best < 0 or rating[j] > rating[best]:
                best = j
            stamp[j] = -1
        if best >= 0:
            u = lo + best
            cluster[v] = min(u, v)
            cluster[u] = min(u, v)
        else:
            cluster[v] = v


@nb.njit(cache=True, nogil=True)
def rebalance_layer(lo, hi, layer, parts, weights, loads, limit, nparts, vptr, vnets, net_w,
                    net_indptr, nblk, blk, cnt, conn, stamp, touched):
    """Moves vertices out of blocks over the layer's limit, each to the block with room where
    it costs least (its nets' blocks first, else the lightest). Returns False if a block is
    still over the limit."""
    for _ in range(4):
        over = False
        for v in range(lo, hi):
            own = parts[v]
            if loads[layer, own] <= limit:
                continue
            n, removed, wsum = _connections(v, own, vptr, vnets, net_w, net_indptr, nblk, blk,
                                            cnt, conn, stamp, touched)
            best = -1
            bestg = -(1 << 62)
            for t in range(n):
                b = touched[t]
                stamp[b] = -1
                g = removed - wsum + conn[b]
                if loads[layer, b] + weights[v] <= limit and g > bestg:
                    best = b
                    bestg = g
            if best < 0:
                for b in range(nparts):
                    if b != own and loads[layer, b] + weights[v] <= limit and \
                            (best < 0 or loads[layer, b] < loads[layer, best]):
                        best = b
            if best >= 0:
                _move(v, own, best, layer, parts, weights, loads, vptr, vnets, net_indptr, nblk,
                      blk, cnt)
            else:
                over = True
        if not over:
            still = False
            for b in range(nparts):
                if loads[layer, b] > limit:
                    still = True
            if not still:
                return True
    return False


@nb.njit(cache=True, nogil=True)
def swap_partners(lo, hi, layer, want_v, want_b, want_g, listed, parts, weights, loads, limit,
                  nparts, vptr, vnets, net_w, net_indptr, nblk, blk, cnt, max_partners):
    """For each vertex v listed as wanting a -> b with a positive gain (best first): move it,
    then move back into a the member u of b in this layer (at most ``max_partners`` looked
    at) whose exact gain makes the pair's positive and keeps both blocks within the limit;
    undo v's move when none does. Returns the gain."""
    n = hi - lo
    # Members of each block in this layer.
    count = np.zeros(nparts + 1, dtype=np.int64)
    for v in range(lo, hi):
        count[parts[v] + 1] += 1
    for b in range(nparts):
        count[b + 1] += count[b]
    members = np.empty(n, dtype=np.int64)
    fill = count[:-1].copy()
    for v in range(lo, hi):
        members[fill[parts[v]]] = v
        fill[parts[v]] += 1
    order = np.argsort(-want_g[:listed], kind="mergesort")
    total = 0
    for q in range(listed):
        i = order[q]
        if want_g[i] <= 0:
            break
        v = want_v[i]
        b = want_b[i]
        a = parts[v]
        if a == b:
            continue
        gv = gain(v, b, parts, vptr, vnets, net_w, net_indptr, nblk, blk, cnt)
        if gv <= 0:
            continue
        _move(v, a, b, layer, parts, weights, loads, vptr, vnets, net_indptr, nblk, blk, cnt)
        best = -1
        bestg = -gv
        seen = 0
        for t in range(count[b], count[b + 1]):
            u = members[t]
            if u < 0 or u == v or parts[u] != b:
                continue
            if loads[layer, a] + weights[u] > limit or loads[layer, b] - weights[u] > limit:
                continue
            seen += 1
            gu = gain(u, a, parts, vptr, vnets, net_w, net_indptr, nblk, blk, cnt)
            if gu > bestg:
                bestg = gu
                best = u
            if seen >= max_partners:
                break
        if best >= 0 and loads[layer, b] - weights[best] <= limit:
            _move(best, b, a, layer, parts, weights, loads, vptr, vnets, net_indptr, nblk, blk,
                  cnt)
            total += gv + bestg
            # Keep the members lists current: v and best traded places.
            for t in range(count[b], count[b + 1]):
                if members[t] == best:
                    members[t] = v
                    break
            for t in range(count[a], count[a + 1]):
                if members[t] == v:
                    members[t] = best
                    break
        elif loads[layer, b] > limit:
            _move(v, b, a, layer, parts, weights, loads, vptr, vnets, net_indptr, nblk, blk, cnt)
        else:  # v alone fits after all (another swap made room)
            total += gv
            for t in range(count[a], count[a + 1]):
                if members[t] == v:
                    members[t] = -1 - v
                    break
    return total
