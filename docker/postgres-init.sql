-- One database per service (the services also create theirs when missing).
CREATE DATABASE orders;
CREATE DATABASE inventory;
CREATE DATABASE payments;
CREATE DATABASE gateway;
