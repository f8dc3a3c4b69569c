package dev.palisade;

import java.io.Closeable;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.SocketTimeoutException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.CancelledKeyException;
import java.nio.channels.ClosedSelectorException;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.SocketChannel;

/**
 * One connection to the agent: a non-blocking SocketChannel (Unix-domain or loopback
 * TCP) waited on with a Selector, so that every step has a deadline (a blocking
 * channel has no read timeout) and a thread interrupt wakes it without closing it.
 * Interruptible: an interrupt while waiting throws InterruptedException; otherwise the
 * interrupt status is kept aside and restored when the connection closes.
 */
final class Connection implements Closeable {
    private final SocketChannel channel;
    private final Selector selector;
    private final SelectionKey key;
    private final boolean interruptible;
    private final Thread owner = Thread.currentThread();
    private boolean interrupted;
    private volatile boolean closed;

    private Connection(SocketChannel channel, Selector selector, boolean interruptible) throws IOException {
        this.channel = channel;
        this.selector = selector;
        this.interruptible = interruptible;
        this.key = channel.register(selector, 0);
    }

    /** Connects to {@code address} by {@code deadline} (System.nanoTime); 0: no deadline. */
    static Connection open(Address address, long deadline, boolean interruptible)
            throws IOException, InterruptedException {
        boolean wasInterrupted = !interruptible && Thread.interrupted();
        if (interruptible && Thread.interrupted()) {
            throw new InterruptedException();
        }
        SocketChannel channel = address.path() != null
                ? SocketChannel.open(StandardProtocolFamily.UNIX)
                : SocketChannel.open(StandardProtocolFamily.INET);
        Selector selector = null;
        Connection conn = null;
        try {
            channel.configureBlocking(false);
            selector = Selector.open();
            conn = new Connection(channel, selector, interruptible);
            conn.interrupted = wasInterrupted;
            boolean connected = address.path() != null
                    ? channel.connect(UnixDomainSocketAddress.of(address.path()))
                    : channel.connect(new InetSocketAddress(address.host(), address.port()));
            while (!connected) {
                conn.await(SelectionKey.OP_CONNECT, deadline);
                connected = channel.finishConnect();
            }
            return conn;
        } catch (IOException | InterruptedException | RuntimeException e) {
            if (conn != null) {
                conn.close();
            } else {
                if (selector != null) {
                    selector.close();
                }
                channel.close();
                if (wasInterrupted) {
                    Thread.currentThread().interrupt();
                }
            }
            throw e;
        }
    }

    /** Writes all of {@code data} by {@code deadline}. */
    void writeAll(byte[] data, long deadline) throws IOException, InterruptedException {
        ByteBuffer buf = ByteBuffer.wrap(data);
        while (buf.hasRemaining()) {
            if (channel.write(buf) == 0) {
                await(SelectionKey.OP_WRITE, deadline);
            }
        }
    }

    /** Reads into {@code buf} by {@code deadline}: the bytes read, or -1 at the end of the stream. */
    int read(ByteBuffer buf, long deadline) throws IOException, InterruptedException {
        while (true) {
            int n = channel.read(buf);
            if (n != 0) {
                return n;
            }
            await(SelectionKey.OP_READ, deadline);
        }
    }

    private void await(int op, long deadline) throws IOException, InterruptedException {
        try {
            awaitOpen(op, deadline);
        } catch (ClosedSelectorException | CancelledKeyException e) {
            throw new IOException("connection closed", e); // by close(), from another thread
        }
    }

    private void awaitOpen(int op, long deadline) throws IOException, InterruptedException {
        key.interestOps(op);
        try {
            while (true) {
                if (closed) {
                    throw new IOException("connection closed");
                }
                long timeoutMs = 0;
                if (deadline != 0) {
                    long left = deadline - System.nanoTime();
                    if (left <= 0) {
                        throw new SocketTimeoutException("timed out");
                    }
                    timeoutMs = Math.max(1, (left + 999_999) / 1_000_000);
                }
                int ready = selector.select(timeoutMs);
                if (Thread.interrupted()) {
                    if (interruptible) {
                        throw new InterruptedException();
                    }
                    interrupted = true; // restored on close; meanwhile it would wake every select
                }
                if (ready > 0) {
                    selector.selectedKeys().clear();
                    return;
                }
            }
        } finally {
            if (key.isValid()) {
                key.interestOps(0);
            }
        }
    }

    /** Closes the connection; from another thread too (it wakes a waiting read). */
    @Override
    public void close() {
        closed = true;
        selector.wakeup();
        try {
            channel.close();
        } catch (IOException e) {
            // nothing left to do with it
        }
        try {
            selector.close();
        } catch (IOException e) {
            // nothing left to do with it
        }
        if (interrupted && Thread.currentThread() == owner) {
            Thread.currentThread().interrupt();
        }
    }
}
