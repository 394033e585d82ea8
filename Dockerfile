# Tollgate: build with the full toolchain, run as a non-root user on the slim image (Node 26, the
# current LTS; better-sqlite3 12 supports Node 20–26, the project itself needs Node ≥ 20.18.1, as undici 7 does).
FROM node:26 AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY tsconfig.json ./
COPY server ./server
COPY routes ./routes
COPY metering ./metering
COPY pricing ./pricing
RUN npm run build && npm prune --omit=dev

FROM node:26-slim
# `docker stop` sends SIGTERM and kills 10 s later: the drain ends before that, so no request is
# left reserved (charged in full at the next start). With `--stop-timeout N`, raise the drain too.
ENV NODE_ENV=production TOLLGATE_HOST=0.0.0.0 TOLLGATE_PORT=8787 TOLLGATE_DRAIN_MS=8000
WORKDIR /app
COPY --from=build /app/node_modules ./node_modules
COPY --from=build /app/dist ./dist
COPY package.json ./
RUN mkdir -p /data && chown node:node /data
USER node
WORKDIR /data
# The SQLite ledger lives here: a volume, so it outlives the container.
VOLUME /data
EXPOSE 8787
# Listening on 0.0.0.0 needs client keys: mount a config with auth.keys at TOLLGATE_CONFIG.
# It asks the address the gateway listens on: loopback when that is every address (0.0.0.0, ::).
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
  CMD node -e "const h=process.env.TOLLGATE_HOST||'127.0.0.1';const a=h==='0.0.0.0'?'127.0.0.1':h==='::'?'[::1]':h.includes(':')?'['+h+']':h;fetch('http://'+a+':'+(process.env.TOLLGATE_PORT||8787)+'/healthz').then(r=>process.exit(r.ok?0:1)).catch(()=>process.exit(1))"
CMD ["node", "/app/dist/server/main.js"]
