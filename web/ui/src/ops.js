// The operations map: every live courier in the view, refreshed each `refresh_ms` from
// /ops/api/live (one bounding-box query server-side), clusters past the marker cap, a card per
// courier, his trail through the audited trail API, totals from the pipeline's metrics.
import L from 'leaflet';
import 'leaflet/dist/leaflet.css';
import './maps.css';
import { readConfig, takeToken, baseMap, refuse, ago } from './common.js';

const cfg = readConfig();
const token = takeToken();
const COLOURS = { fresh: '#1f9d55', late: '#e69500', evicting: '#d0323c' };
const $ = (id) => document.getElementById(id);

// What the tests and the benchmark read (window.opsMap): state only, never a control path.
const state = { markers: new Map(), clusters: 0, inView: 0, refreshes: 0, lastApplyMs: 0, refused: false, trail: null };
window.opsMap = state;

let stopped = false;
function stop(title, detail) {
  stopped = true;
  state.refused = true;
  state.markers.clear();
  refuse(title, detail);
}

async function api(path) {
  const r = await fetch(path, { headers: { Authorization: `Bearer ${token}` }, cache: 'no-store' });
  if (r.status === 401) {
    stop('Access refused', 'This ops token is missing, expired or not an ops token. Ask for a new one: courier-pipeline token ops --user <you>.');
    throw new Error('refused');
  }
  return r;
}

if (!token) {
  stop('An ops token is needed', 'Open this page as /ops?token=<ops token> (courier-pipeline token ops --user <you>).');
} else {
  start();
}

function start() {
  const map = baseMap('map', cfg, { zoomSnap: 0.5 });
  state.map = map;
  const renderer = L.canvas({ padding: 0.2 });
  const markerLayer = L.layerGroup().addTo(map);
  const clusterLayer = L.layerGroup().addTo(map);
  let trailLayer = null;
  let selected = null;

  function style(m) {
    const [, , , , freshness, order] = m;
    return {
      renderer,
      radius: order ? 6 : 4.5,
      color: order ? '#13306e' : '#ffffff',
      weight: order ? 2.5 : 1,
      fillColor: COLOURS[freshness] || '#888',
      fillOpacity: 0.95,
    };
  }

  function apply(view) {
    const t0 = performance.now();
    state.inView = view.in_view;
    clusterLayer.clearLayers();
    state.clusters = view.clusters.length;
    const keep = new Set();
    for (const m of view.markers) {
      const [id, lat, lon, age, freshness, order] = m;
      keep.add(id);
      let e = state.markers.get(id);
      if (!e) {
        const layer = L.circleMarker([lat, lon], style(m)).addTo(markerLayer);
        layer.on('click', () => showCard(id));
        e = { layer, lat, lon, age, freshness, order };
        state.markers.set(id, e);
      } else {
        if (e.lat !== lat || e.lon !== lon) e.layer.setLatLng([lat, lon]);
        if (e.freshness !== freshness || e.order !== order) e.layer.setStyle(style(m));
        Object.assign(e, { lat, lon, age, freshness, order });
      }
    }
    for (const [id, e] of state.markers) {
      if (!keep.has(id)) {
        markerLayer.removeLayer(e.layer);
        state.markers.delete(id);
      }
    }
    for (const [lat, lon, n] of view.clusters) {
      const size = Math.round(20 + 7 * Math.log10(n));
      L.marker([lat, lon], {
        icon: L.divIcon({ className: '', html: `<div class="cluster" style="width:${size}px;height:${size}px">${n}</div>`, iconSize: [size, size] }),
        keyboard: false,
      }).on('click', () => map.setView([lat, lon], map.getZoom() + 2)).addTo(clusterLayer);
    }
    state.lastApplyMs = performance.now() - t0;
    state.refreshes += 1;
    const clustered = view.clusters.length ? ` in ${view.clusters.length} clusters (zoom in for couriers)` : '';
    $('view').textContent = `${view.in_view.toLocaleString()} in view${clustered}${view.truncated ? ', more not read' : ''}`;
    $('updated').textContent = new Date(view.now * 1000).toLocaleTimeString();
  }

  let inFlight = false;
  async function refresh() {
    if (stopped || inFlight) return;
    inFlight = true;
    try {
      const cols = Math.max(4, Math.round(map.getSize().x / 64));
      const r = await api(`/ops/api/live?bbox=${map.getBounds().toBBoxString()}&cols=${cols}`);
      if (r.ok) apply(await r.json());
      else $('updated').textContent = `refresh failed (${r.status})`;
    } catch (e) {
      if (!stopped) $('updated').textContent = 'refresh failed (network)';
    } finally {
      inFlight = false;
    }
  }

  async function totals() {
    if (stopped) return;
    try {
      const r = await api('/ops/api/totals');
      if (!r.ok) return;
      const t = await r.json();
      $('t-live').textContent = t.live.toLocaleString();
      $('t-rate').textContent = t.points_per_s == null ? '–' : `${t.points_per_s.toLocaleString()}/s`;
      const loss = t.loss || {};
      const names = { ingest_queue_dropped: 'ingest queue drops', invalid: 'invalid points', tracks_dropped: 'tracks dropped',
        history_dropped: 'history rows dropped', broker_cursor_jumps: 'bus loss alerts', viewer_points_dropped: 'viewer drops' };
      $('t-loss').innerHTML = '';
      for (const [k, label] of Object.entries(names)) {
        if (loss[k] == null) continue;
        const dt = document.createElement('dt');
        dt.textContent = label;
        const dd = document.createElement('dd');
        dd.textContent = Math.round(loss[k]).toLocaleString();
        $('t-loss').append(dt, dd);
      }
    } catch (e) { /* shown by the next refresh */ }
  }

  async function showCard(id) {
    selected = id;
    const r = await api(`/ops/api/couriers/${encodeURIComponent(id)}`);
    const card = $('card');
    card.hidden = false;
    $('trail-form').hidden = true;
    $('trail-status').textContent = '';
    if (r.status === 404) {
      $('c-id').textContent = id;
      $('c-body').innerHTML = '<dt>state</dt><dd>not live</dd>';
      return null;
    }
    if (!r.ok) return null;
    const c = await r.json();
    $('c-id').textContent = c.id;
    const rows = [
      ['last seen', c.last_seen ? `${new Date(c.last_seen * 1000).toLocaleTimeString()} (${ago(c.age)})` : '–'],
      ['state', c.freshness || '–'],
      ['phone lag', c.phone_lag == null ? '–' : `${c.phone_lag.toFixed(2)} s`],
      ['order', c.order || 'none'],
      ['seq', c.seq == null ? '–' : String(c.seq)],
      ['seq since', c.seq_epoch_ts ? new Date(c.seq_epoch_ts * 1000).toLocaleString() : '–'],
    ];
    const body = $('c-body');
    body.innerHTML = '';
    for (const [k, v] of rows) {
      const dt = document.createElement('dt');
      dt.textContent = k;
      const dd = document.createElement('dd');
      dd.textContent = v;
      body.append(dt, dd);
    }
    return c;
  }

  $('search').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const id = $('search-id').value.trim();
    if (!id) return;
    const c = await showCard(id);
    if (c && c.lat != null) map.setView([c.lat, c.lon], Math.max(map.getZoom(), 16));
  });
  $('card-close').addEventListener('click', () => { $('card').hidden = true; selected = null; });
  $('show-trail').addEventListener('click', () => {
    $('trail-form').hidden = false;
    $('trail-reason').focus();
    $('trail-status').textContent = 'Reading a trail is audited: say why.';
  });
  $('trail-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const reason = $('trail-reason').value.trim();
    if (!reason) {
      $('trail-status').textContent = 'A reason is required.';
      return;
    }
    const to = new Date(Date.now() + 60_000).toISOString();
    const from = new Date(Date.now() - Number($('trail-hours').value) * 3600_000).toISOString();
    const q = new URLSearchParams({ from, to, reason });
    const r = await api(`/couriers/${encodeURIComponent(selected)}/trail?${q}`);
    const body = await r.json();
    if (!r.ok) {
      $('trail-status').textContent = `Trail refused: ${body.error || r.status}`;
      return;
    }
    if (trailLayer) map.removeLayer(trailLayer);
    const n = (body.properties && body.properties.points || []).length;
    trailLayer = body.geometry ? L.geoJSON(body, { style: { color: '#2357d9', weight: 3, opacity: 0.8 },
      pointToLayer: (_, ll) => L.circleMarker(ll, { renderer, radius: 4 }) }).addTo(map) : null;
    if (trailLayer) map.fitBounds(trailLayer.getBounds(), { maxZoom: 17, padding: [40, 40] });
    state.trail = { courier: selected, points: n };
    $('trail-status').textContent = `${n} points drawn (this read is in the audit log).`;
    $('trail-form').hidden = true;
  });

  map.on('moveend', refresh);
  // The first view: the whole fleet (one clustered read), then fit to it.
  (async () => {
    map.setView([20, 0], 2);
    try {
      const r = await api('/ops/api/live?bbox=-180,-85,180,85');
      if (r.ok) {
        const v = await r.json();
        const pts = v.clusters.map(([lat, lon]) => [lat, lon]).concat(v.markers.map((m) => [m[1], m[2]]));
        if (pts.length) map.fitBounds(L.latLngBounds(pts), { maxZoom: 15, padding: [30, 30], animate: false });
        else apply(v);
      }
    } catch (e) { /* refused or down: shown */ }
    refresh();
    totals();
    setInterval(refresh, cfg.refresh_ms || 1000);
    setInterval(totals, 2000);
  })();
}
